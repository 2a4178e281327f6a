"""Engine lifecycle types shared by the controller, the UI, telemetry and chat (the contract)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal


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
    pool_slots: int | None = None  # from the delta-tier sizing line; 0 = pool disabled
    slot_mib: float | None = None
    diagnosis: Diagnosis | None = None
    message: str = ""
    since: float = field(default_factory=time.time)
    last_ready_profile: str | None = None
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

    @property
    def is_ready(self) -> bool:
        return self.state is EngineState.READY
