"""The types that cross package lines: what the engine publishes, what a GPU reader returns, the pool sizing.

Engine control, telemetry, chat, the gateway, the self-test and the UI meet here instead of importing one
another: a consumer imports a snapshot or a sample type from this module, never the producer's package, so
the packages form no import cycle (tests/test_import_boundaries.py checks it; README, "Contracts and import boundaries").
Only plain data, Protocols and type aliases live here; this module imports nothing from the app.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, Protocol

# -- the engine, as its consumers see it -------------------------------------------------------------------


class EngineState(str, Enum):
    STOPPED = "stopped"
    PREFLIGHT = "preflight"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"
    STALLED = "stalled"  # ready, but requests run and no token moved for stall_after_s (docs/engine.md)


# An engine container exists and is meant to serve (the states a start must refuse, a stop must act on).
LIVE_STATES = frozenset({EngineState.STARTING, EngineState.READY, EngineState.STALLED})


@dataclass(frozen=True)
class LogLine:
    """One line of engine output. `stream` is kept apart so stdout/stderr can be filtered."""

    text: str
    stream: Literal["stdout", "stderr"] = "stdout"
    ts: float = field(default_factory=time.time)
    container_id: str = ""


@dataclass(frozen=True)
class Diagnosis:
    """A classified failure: what happened, and the fix (from the card where it has one)."""

    reason: str  # machine id, e.g. "cuda_oom_at_load", "pool_not_loaded"
    title: str  # one line for the badge
    explanation: str
    fix: str
    evidence: tuple[str, ...] = ()  # log lines that led to the classification


@dataclass(frozen=True)
class EngineSnapshot:
    """What is running, as the panel knows it right now. Immutable; the controller replaces it."""

    state: EngineState = EngineState.STOPPED
    profile_id: str | None = None
    phase: str = ""  # human boot phase, e.g. "planes from cache 12/43"
    base_url: str = ""
    served_name: str = ""
    container_id: str = ""
    container_name: str = ""
    simulated: bool = False
    pool: PoolSizing | None = None  # the boot's delta-tier sizing line (None: none yet)
    diagnosis: Diagnosis | None = None
    message: str = ""
    since: float = field(default_factory=time.time)
    last_ready_profile: str | None = None
    build: str = ""  # the engine build the container runs (its moet-panel.build label; docs/engine.md "Upgrading")
    image: str = ""  # the container's image
    # Supervision (docs/engine.md, "Keeps serving"): what should run, the restart policy and its counters, the
    # canary. Exported as metrics from the snapshot (restarts_total, switches_total{result}).
    desired: str = ""  # "serve:<profile>" | "stopped" | "" (never set)
    restart_policy: str = "on-failure"  # "on-failure" | "never"
    restarts_total: int = 0  # restarts the supervisor made (crash, stall, reboot recovery)
    restart_try: int = 0  # tries in the current restart window (0 = none pending)
    gave_up: bool = False  # the policy gave up (cap reached or a non-healing class): waits for a person
    switches_ok: int = 0
    switches_failed: int = 0  # failed, and no rollback either
    switches_rolled_back: int = 0  # the new profile failed; the previous one serves again
    switches_cancelled: int = 0  # a stop cancelled the switch
    canary: str = ""  # "" off/not ready, else e.g. "ok (0.04 s)", "failed 1 of 2: timeout"
    canary_ok: bool | None = None  # the last canary's verdict (None: none judged yet; a yielded one is not judged)
    canary_at: float = 0.0  # when the last canary ran (Unix time)
    canary_latency_s: float = 0.0
    canary_failures_total: int = 0  # canaries that produced no token, since the panel started
    stalls_total: int = 0
    # Drain (docs/engine.md "Keeps serving"): a stop or switch first lets the answers in flight finish.
    draining: bool = False  # True while a stop/switch waits for answers in flight (new ones are refused)
    drain_in_flight: int = 0  # answers still running when last counted (gateway + Chat tab)
    drain_deadline: float = 0.0  # Unix time the grace ends; the stop goes on then, or at "Switch now"
    expected_back_s: float = 0.0  # seconds until the engine serves again (a Retry-After); 0: unknown

    @property
    def is_ready(self) -> bool:
        return self.state is EngineState.READY


class AnswerCounter(Protocol):
    """Something that streams the engine's answers to someone (the gateway, the Chat tab): a stop or switch
    waits until its count is 0 or the grace ends (docs/engine.md "Keeps serving")."""

    def answers_in_flight(self) -> int: ...


SnapshotFn = Callable[[], "EngineSnapshot | None"]  # the controller's snapshot(); None: no controller


@dataclass(frozen=True)
class ChatRoute:
    """The Chat tab's way to the engine through the panel's gateway (docs/chat.md "Taking turns"): the gateway's
    address on this box and the panel's own key, so chat answers take their turn in the gateway's fair queue."""

    url: str  # http(s)://host:port of the panel's gateway process, as this box reaches it
    key: str  # the panel's own key (kept in the panel's memory only)
    verify: bool = True  # False: TLS to the box's own address with the owner's certificate, not checked (service.py)


# The Chat tab's answer cap (the card: answers to hard tasks run to 20k+ tokens); its gateway key carries the same
# cap, above the gateway's shared default (docs/chat.md "Taking turns").
CHAT_MAX_TOKENS = 32768


class ChatGate(Protocol):
    """The panel's gateway as the Chat tab uses it (gateway/service.py `GatewayService`)."""

    def chat_route(self) -> ChatRoute | None:
        """The way in now; None while the gateway is off (the chat then talks to the engine directly)."""
        ...

    def waiting_ahead(self, key: str) -> int | None:
        """How many requests get the GPU before this key's waiting one; None when it waits for none."""
        ...


class EngineWatch(Protocol):
    """The newest engine snapshot and the seq of the change event that made it, kept up to date by the engine's
    publisher (app/backend/engine/decider/events.py `SnapshotWatch`; docs/engine.md, "Who listens"). A reader keeps the
    last seq it acted on: an equal seq means nothing changed. `close()` unsubscribes."""

    @property
    def seq(self) -> int: ...

    @property
    def snapshot(self) -> EngineSnapshot: ...

    @property
    def closed(self) -> bool: ...

    def current(self) -> tuple[int, EngineSnapshot]: ...

    def wait(self, after: int, timeout: float) -> tuple[int, EngineSnapshot]: ...

    def close(self) -> None: ...


class EngineEvents(Protocol):
    """Something whose changes can be watched: the controller (`watch`), a test's fake engine."""

    def watch(self, on_change: Callable[[], None] | None = None) -> EngineWatch: ...


class EngineFeed(EngineEvents, Protocol):
    """What a reader of the engine (telemetry, alerting, tests' fakes) may call on the controller: its change
    events (`watch`), the snapshot, the log stream with its recent lines (boot sizing lines are replayed from
    them), and the pids of the engine's processes (to tag its GPU processes)."""

    def snapshot(self) -> EngineSnapshot: ...

    def add_log_listener(self, cb: Callable[[LogLine], None]) -> Callable[[], None]: ...

    def recent_logs(self, n: int = ...) -> Iterable[LogLine]: ...

    def container_pids(self) -> set[int]: ...

    def log_tail(self, container_id: str, n: int) -> list[tuple[str, str]]:
        """The last `n` lines of that run's stdout then stderr, (stream, text); [] without a runtime."""
        ...


# -- the FP4 pool's sizing (docs/engine.md, "Engine facts") -------------------------------------------------


@dataclass(frozen=True)
class PoolSizing:
    """What a boot sizing line (`moe_w2 delta tier ...`) says; the boot tracker and the pool telemetry read
    the same value. slots: None = sizing deferred until after the KV cache; 0 = the FP4 pool is disabled."""

    slots: int | None
    slot_mib: float | None = None
    pool_gib: float | None = None
    auto: bool = False
    deferred: bool = False
    free_after_kv_gib: float | None = None
    reserve_gib: float | None = None

    @property
    def disabled(self) -> bool:
        return self.slots == 0


def slots_of(pool: PoolSizing | None) -> int | None:
    """The slots a boot's sizing says: None before a sizing line or while deferred, 0 = the pool is disabled."""
    return pool.slots if pool is not None else None


# -- the GPUs ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None
    name: str = ""
    container: str = ""  # engine container name when the pid belongs to it


@dataclass(frozen=True)
class GpuSample:
    index: int
    uuid: str
    name: str
    compute_capability: tuple[int, int] | None
    memory_total: int
    memory_used: int  # v2 "used" (excludes driver-reserved): what nvidia-smi shows as used
    memory_reserved: int
    util_gpu: float | None = None
    util_mem: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    pcie_tx_kbs: float | None = None
    pcie_rx_kbs: float | None = None
    ecc_current: bool | None = None
    ecc_pending: bool | None = None
    processes: tuple[GpuProcess, ...] = ()
    ts: float = 0.0
    simulated: bool = False  # from the demo-mode SIMULATED reader, never a real card

    @property
    def memory_in_use(self) -> int:
        """What nvidia-smi shows as used: NVML v2 "used", the driver's reserve apart (`memory_reserved`). Measured on
        an H200, driver 580: nvidia-smi 0 MiB idle and 1,139 MiB under load where v2 used + reserved gave 615 and
        1,754 (docs/engine.md, "VRAM as nvidia-smi shows it"); the VRAM alert and header use this figure."""
        return self.memory_used


class GpuReader(Protocol):
    """Anything that can read the GPUs now (real NVML, the SIMULATED card, the CI fake, none)."""

    @property
    def available(self) -> bool: ...

    @property
    def error(self) -> str:
        """Why no GPU can be read ("no NVIDIA GPU: libnvidia-ml.so not found"), '' when available."""
        ...

    @property
    def simulated(self) -> bool:
        """The demo-mode SIMULATED card (never a real one): the UI labels what it shows."""
        ...

    def read(self) -> list[GpuSample]: ...

    def close(self) -> None: ...


class GpuCountError(RuntimeError):
    """The box's GPUs could not be counted at start (NVML kept failing past its deadline): the panel refuses
    to supervise a wrong number of engines (docs/engine.md "How many GPUs"). The message says what to do."""


class ReaderStatus:
    """`available` / `error` / `simulated` derived from one `_error` sentence, and a `close()` that has
    nothing to release (shared by the readers)."""

    _error: str = ""
    _simulated: bool = False

    @property
    def available(self) -> bool:
        return not self._error

    @property
    def error(self) -> str:
        return self._error

    @property
    def simulated(self) -> bool:
        return self._simulated

    def close(self) -> None:
        return None


# -- ASGI (the panel's gate, the access log and the gateway's proxy wrap the same callables) -----------------

# A decoded JSON object (a file's record, a stream's chunk, a Docker event): its values are whatever the source
# held, checked where they are read. The one name for "JSON from outside" (docs/architecture.md).
JsonObject = dict[str, Any]
Scope = MutableMapping[str, Any]  # ASGI's scope and messages are open dicts (asgiref's TypedDicts are unions)
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
# In the scope of a signed-in request the web gate hands on: a `() -> bool` saying whether that session is still
# signed in; a long-lived answer (the page feed) ends when it says False (app/backend/web/gate.py).
SESSION_ALIVE = "moet.session_alive"
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# Units: how the panel writes sizes and durations, in the CLI and the tabs alike: GiB everywhere, as the card
# (docs/downloads.md, "Progress").
GiB = 1 << 30


_SIZE_UNITS = {"": 1, "k": GiB >> 20, "m": GiB >> 10, "g": GiB, "t": GiB << 10}


def docker_size_bytes(text: str) -> int:
    """Docker's size form (`32g`, `512m`, `1024`; binary units, as `--shm-size`) in bytes; 0 when empty or
    unreadable."""
    t = text.strip().lower().removesuffix("b")
    unit = t[-1] if t and t[-1] in "kmgt" else ""
    num = t[:-1] if unit else t
    try:
        return int(float(num) * _SIZE_UNITS[unit]) if num else 0
    except ValueError:
        return 0


_SHOWN_UNITS: tuple[tuple[float, str], ...] = ((GiB, "GiB"), (2**20, "MiB"), (2**10, "KiB"))


def _size_unit(n: float) -> tuple[float, str]:
    return next(((d, u) for d, u in _SHOWN_UNITS if abs(n) >= d), (1, "B"))


def _size_num(n: float, div: float) -> str:
    if div == 1 or n == 0:
        return f"{n:.0f}"
    v = n / div
    return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}" if abs(v) < 100 else f"{v:.0f}"


def size_text(n: float) -> str:
    """Bytes in the unit that reads: `14.0 MiB`, `1.25 GiB`, `512 B` (issue 49: a 14 MB artifact read
    "0.014 GiB")."""
    div, unit = _size_unit(n)
    return f"{_size_num(n, div)} {unit}"


def size_pair_text(done: float, total: float) -> str:
    """`3.20 / 14.0 MiB`: both in the total's unit, so the two read side by side (not "0.00 GiB / 0.014 GiB")."""
    div, unit = _size_unit(max(abs(done), abs(total)))
    return f"{_size_num(done, div)} / {_size_num(total, div)} {unit}"


def count_text(n: int, word: str, plural: str | None = None) -> str:
    """`1 artifact`, `3 artifacts` (issue 49: "all 1 artifact(s)")."""
    return f"{n:,} {word if n == 1 else plural or word + 's'}"


def duration_text(seconds: float | None) -> str:
    """`1h02m` from an hour on, else `3m05s`; `—` when unknown."""
    if seconds is None:
        return "—"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
