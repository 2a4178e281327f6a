"""The one classifier of engine log lines that more than one consumer reads (docs/engine.md, "Logs").

The FP4 pool sizing lines (docs/engine.md, "Engine facts") drive both the boot tracker (`engine/logs/bootlog.py`: is the pool
loaded, what the badge says) and the pool telemetry (`telemetry/trace.py`: the pool panel). One parser
here means one pool-slot value everywhere. The panel's own probe requests in the engine's access log are
recognised here too (the Logs views hide them by default; the files keep every line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from app.backend.contracts import LogLine, PoolSizing

_TIER = re.compile(r"moe_w2 delta tier: (?P<slots>\d+) slots x (?P<mib>[\d.]+) MiB(?: \((?P<gib>[\d.]+) GiB pool\))?")
_AUTO = re.compile(
    r"moe_w2 delta tier AUTO: (?P<slots>\d+) slots x (?P<mib>[\d.]+) MiB(?: \((?P<gib>[\d.]+) GiB pool; "
    r"(?P<free>[\d.]+) GiB was free after KV, reserve (?P<reserve>[\d.]+) GiB\))?"
)
_AUTO_OFF = re.compile(
    r"moe_w2 delta tier AUTO: (?:(?P<free>[\d.]+) GiB free after KV < reserve (?P<reserve>[\d.]+) GiB -> )?"
    r".*pool disabled"
)
_DEFERRED = re.compile(r"moe_w2 delta tier: auto-sizing deferred(?: .*\(slot (?P<mib>[\d.]+) MiB, reserve "
                       r"(?P<reserve>[\d.]+) GiB\))?")


# Forms of vLLM-Moet main after the pinned de4af53 (read from its log statements, docs/engine.md "Upgrading the
# engine"): the EXL3 route stages its FP4 pool from a delta pack or from the checkpoint (a slot size, no count yet),
# and its per-layer base line says whether an FP4 pool exists at all (", +FP4 need-pool" or nothing).
_EXL3_DELTA = re.compile(r"moe_w2 EXL3 \u0394-pool: staging from delta pack .*slot (?P<mib>[\d.]+) MiB")
_EXL3_NEED = re.compile(r"moe_w2 EXL3 v2: FP4 need-pool staging .*own-scale slots (?P<mib>[\d.]+) MiB")
_EXL3_BASE = re.compile(r"moe_w2 EXL3 base: layer_key \d+ <- pack layer \d+ \(.*layers loaded(?P<pool>, \+FP4 need-pool)?\)")


def _f(v: str | None) -> float | None:
    return float(v) if v is not None else None


def pool_sizing(msg: str) -> PoolSizing | None:
    """Parse a pool sizing line (the message part, prefix removed); None for any other line."""
    if "moe_w2 EXL3 " in msg:
        return _exl3_sizing(msg)
    if "delta tier" not in msg:
        return None
    if m := _AUTO.search(msg):
        return PoolSizing(int(m["slots"]), float(m["mib"]), _f(m["gib"]), True, False, _f(m["free"]),
                              _f(m["reserve"]))
    if m := _AUTO_OFF.search(msg):
        return PoolSizing(0, None, 0.0, True, False, _f(m["free"]), _f(m["reserve"]))
    if m := _DEFERRED.search(msg):
        return PoolSizing(None, _f(m["mib"]), None, True, True, None, _f(m["reserve"]))
    if m := _TIER.search(msg):
        return PoolSizing(int(m["slots"]), float(m["mib"]), _f(m["gib"]))
    return None


def _exl3_sizing(msg: str) -> PoolSizing | None:
    if m := _EXL3_DELTA.search(msg):
        return PoolSizing(None, float(m["mib"]))
    if m := _EXL3_NEED.search(msg):
        return PoolSizing(None, float(m["mib"]))
    if (m := _EXL3_BASE.search(msg)) and m["pool"] is None:
        return PoolSizing(0)  # base layers loaded without an FP4 pool: the pool is absent, coverage is not "—"
    return None


# Words that mark a line as being about the FP4 pool: a line carrying them that no parser above (or the trace
# parser's summary) reads is a form this panel does not know, and the panel says so instead of showing a blank.
# (The `[delta] tick` summary is checked by the trace parser itself.)
POOL_WORDS = ("moe_w2 delta tier", "\u0394-pool", "need-pool")


def unknown_pool_form(msg: str) -> bool:
    """A pool sizing line (by its words) that pool_sizing cannot read: a newer or older build's form."""
    if not any(w in msg for w in POOL_WORDS):
        return False
    if (m := _EXL3_BASE.search(msg)) is not None and m["pool"] is not None:
        return False  # a base layer loaded with its pool: known, carries no sizing
    return pool_sizing(msg) is None


# uvicorn access lines for the panel's own polling: GET /metrics, /health, /v1/models from a loopback address, or
# with no address at all: uvicorn prints none for a client on the engine's unix socket (docs/engine.md "Engine facts").
_PROBE = re.compile(r'(?:(?:127\.\d+\.\d+\.\d+|\[?::1\]?|localhost):\d+|INFO:\s*) - "GET /(?:metrics|health|v1/models)[/? "]')


def is_panel_probe(text: str) -> bool:
    return '"GET /' in text and bool(_PROBE.search(text))


StreamChoice = Literal["both", "stdout", "stderr"]


@dataclass(frozen=True)
class LogFilter:
    """What a log view keeps: one stream or both, lines containing `needle` (any case), and the panel's own
    probe requests only when asked. The Engine tab's tail, the Logs tab and the log download all use it."""

    stream: StreamChoice = "both"
    needle: str = ""
    probes: bool = False

    def apply(self, lines: Iterable[LogLine]) -> list[LogLine]:
        needle = self.needle.lower()
        return [ln for ln in lines
                if (self.stream == "both" or ln.stream == self.stream) and needle in ln.text.lower()
                and (self.probes or not is_panel_probe(ln.text))]


EVERY_LINE = LogFilter(probes=True)
