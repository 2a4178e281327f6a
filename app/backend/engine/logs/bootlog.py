"""Boot-phase tracking from engine log lines (docs/engine.md, "Engine facts": boot lines, pool sizing, readiness).

`BootTracker.feed(text)` is fed every line of one engine run; it keeps the human boot phase, the
pool sizing (slots, MiB per slot), planes-cache hits/misses and whether the API is up. Pure and
cheap: one regex pass per line, no I/O, safe to replay over an adopted container's old logs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from app.backend.contracts import PoolSizing
from app.backend.engine.logs.loglines import pool_sizing

ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
# vLLM prefix (docs/engine.md, "Engine facts"): optional "(proc pid=N) ", level, timestamp, [file:line]
PREFIX_RE = re.compile(
    r"^(?:\((?P<proc>[^) ]+) pid=(?P<pid>\d+)\) )?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"\d\d-\d\d \d\d:\d\d:\d\d \[[^\]]+\] )?(?P<msg>.*)$"
)
LAYERS_DEFAULT = 43  # DS4-Flash main-stack MoE layers (docs/engine.md, "Engine facts")

FROM_CACHE_RE = re.compile(r"moe_w2: layer (?P<layer>\d+) planes from cache")
BUILT_RE = re.compile(r"moe_w2: layer (?P<layer>\d+) planes built")
CACHE_MISMATCH_RE = re.compile(r"moe_w2 planes cache: (metadata mismatch|read failed|MISS layer)")
LOADER_SKIP_RE = re.compile(r"moe_w2 LOADER-SKIP armed")
NUM_LAYERS_RE = re.compile(r"num_hidden_layers[\"'=: ]+(?P<n>\d+)")
API_UP_RE = re.compile(
    r"Starting vLLM (?:API )?server|Application startup complete|Uvicorn running on|Available routes are"
)

# (pattern, phase label) for the progress lines that carry no numbers; order = boot order.
PHASE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"checkpoint (?:hash|identity|stat)|pinned snapshot present|hashing", re.I), "checkpoint hashing"),
    # "Loading weights took" is the end of loading, not its start (upstream vLLM on CPU prints no later
    # "Model loading took" line: docs/real-engine.md#boot-phases)
    (re.compile(r"Starting to load model|Loading safetensors checkpoint shards|Loading weights(?! took)"),
     "loading weights"),
    (re.compile(r"Model loading took|Loading weights took"), "weights loaded"),
    (re.compile(r"Available KV cache memory|GPU KV cache size|KV cache (?:memory|size|allocat)"), "KV cache"),
    (re.compile(r"Capturing CUDA graph|Graph capturing|CUDA graph capture", re.I), "CUDA graphs"),
    (re.compile(r"init engine \(profile, create kv cache"), "engine initialised"),
)

PHASE_RANK = {label: rank for rank, (_, label) in enumerate(PHASE_PATTERNS)}


@dataclass(frozen=True)
class BootProgress:
    """What the log has told us about this boot so far."""

    phase: str = "container started"
    pool: PoolSizing | None = None  # the last sizing line (None: none yet; a disabled pool keeps the slot size)
    layers_from_cache: int = 0
    layers_built: int = 0
    cache_warnings: tuple[str, ...] = ()
    loader_skip: bool = False
    api_up: bool = False
    n_layers: int = LAYERS_DEFAULT
    lines_seen: int = 0

    @property
    def cache_miss(self) -> bool:
        """`planes built` means the planes cache missed: the checkpoint is re-quantized on the host."""
        return self.layers_built > 0


def message_of(text: str) -> str:
    """The message part of a vLLM log line (prefix and colours removed)."""
    clean = ANSI_RE.sub("", text).rstrip()
    m = PREFIX_RE.match(clean)
    return m.group("msg") if m else clean


@dataclass
class BootTracker:
    """Mutable accumulator owned by one follower; `progress` is an immutable snapshot."""

    progress: BootProgress = field(default_factory=BootProgress)

    def feed(self, text: str) -> bool:
        """Update from one line; returns True when the visible progress changed."""
        before = self.progress
        self.progress = _advance(before, message_of(text))
        return self.progress != before


def _advance(p: BootProgress, msg: str) -> BootProgress:
    p = replace(p, lines_seen=p.lines_seen + 1)
    if (ps := pool_sizing(msg)) is not None:  # the one sizing parser, shared with telemetry/trace.py
        if ps.deferred:
            return replace(p, pool=ps, phase="pool sizing deferred until after KV cache")
        if ps.slots is None:  # a newer build's staging line names the slot size only (loglines.py): no count yet
            return p
        slots = ps.slots or 0
        if not slots:  # the slot size a sized line gave before stays known (a deferred line's is only planned)
            ps = replace(ps, slot_mib=p.pool.slot_mib if p.pool is not None and not p.pool.deferred else None)
        return replace(p, pool=ps, phase=_pool_phase(slots))
    if m := FROM_CACHE_RE.search(msg):
        n = p.layers_from_cache + 1
        return replace(p, layers_from_cache=n, phase=f"planes from cache {n}/{p.n_layers}")
    if m := BUILT_RE.search(msg):
        n = p.layers_built + 1
        return replace(p, layers_built=n, phase=f"planes BUILT {n}/{p.n_layers} — cache MISS")
    if CACHE_MISMATCH_RE.search(msg):
        return replace(p, cache_warnings=(p.cache_warnings + (msg,))[-5:])
    if LOADER_SKIP_RE.search(msg):
        return replace(p, loader_skip=True, phase="loader-skip armed (warm boot)")
    if m := NUM_LAYERS_RE.search(msg):
        return replace(p, n_layers=int(m["n"]))
    if API_UP_RE.search(msg):
        return replace(p, api_up=True, phase="API up")
    if p.api_up:
        return p  # later lines never move the phase backwards
    for rank, (pattern, label) in enumerate(PHASE_PATTERNS):
        if pattern.search(msg):
            # never backwards: vLLM's tqdm bar ("Loading safetensors checkpoint shards: 100%", stderr)
            # arrives after "Loading weights took" (docs/real-engine.md#boot-phases)
            return replace(p, phase=label) if rank > PHASE_RANK.get(p.phase, -1) else p
    return p


def _pool_phase(slots: int) -> str:
    return f"pool sized: {slots} slots" if slots > 0 else "pool DISABLED (0 slots)"
