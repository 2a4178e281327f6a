"""The engine lifecycle as an explicit state machine: typed events, one pure transition function.

    stopped ──PreflightBegan──▶ preflight ──BootBegan──▶ starting(phase) ──BecameReady──▶ ready
       ▲                            │                      │   ▲ BootProgressed              │
       │                            └──────Failed──────────┼───┴─────────────▶ failed ◀───────┤
       └──────Stopped◀── stopping ◀──StopBegan─────────────┴──────────────────────────────────┘
    Adopted (panel restart, or a container started/replaced outside this process) ──▶ starting | ready
    Vanished (the container stopped/was removed outside this process's operation) ──▶ stopped
    ready ──Stalled──▶ stalled ──Unstalled──▶ ready   (liveness after ready, docs/engine.md)
    Supervised (desired state, restart policy, counters, canary) ──▶ same state

`transition()` is the ONLY place a snapshot's state changes; illegal moves raise, so a bug shows up
as an error instead of a badge that lies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Union

from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState, PoolSizing



class IllegalTransition(RuntimeError):
    pass


@dataclass(frozen=True)
class PreflightBegan:
    profile_id: str


@dataclass(frozen=True)
class _Container:
    """The engine container an event points the snapshot at (one it booted, or one it found running)."""

    profile_id: str
    container_id: str
    container_name: str
    base_url: str
    served_name: str
    simulated: bool


@dataclass(frozen=True)
class BootBegan(_Container):
    build: str = ""
    image: str = ""


@dataclass(frozen=True)
class BootProgressed:
    phase: str
    pool: PoolSizing | None = None
    message: str = ""


@dataclass(frozen=True)
class BecameReady:
    message: str = ""


@dataclass(frozen=True)
class Adopted(_Container):
    ready: bool
    phase: str
    pool: PoolSizing | None = None
    message: str = "reattached to the running engine"
    build: str = ""
    image: str = ""


@dataclass(frozen=True)
class StopBegan:
    message: str = ""


@dataclass(frozen=True)
class Stopped:
    message: str = ""


@dataclass(frozen=True)
class Vanished:
    """Observed from Docker: the engine is gone and nothing failed (e.g. stopped outside the panel)."""

    message: str
    diagnosis: Diagnosis | None = None


@dataclass(frozen=True)
class Stalled:
    diagnosis: Diagnosis
    message: str = ""


@dataclass(frozen=True)
class Unstalled:
    message: str = ""


@dataclass(frozen=True)
class Failed:
    diagnosis: Diagnosis
    message: str = ""
    container_id: str | None = None  # the failed run this badge explains (None = keep the snapshot's)
    container_name: str | None = None


@dataclass(frozen=True)
class Supervised:
    """No state change: the supervisor's own fields (desired state, policy, counters, canary). None = unchanged."""

    desired: str | None = None
    restart_policy: str | None = None
    restarts_total: int | None = None
    restart_try: int | None = None
    gave_up: bool | None = None
    switches_ok: int | None = None
    switches_failed: int | None = None
    switches_rolled_back: int | None = None
    switches_cancelled: int | None = None
    canary: str | None = None
    canary_ok: bool | None = None
    canary_at: float | None = None
    canary_latency_s: float | None = None
    canary_failures_total: int | None = None
    stalls_total: int | None = None
    message: str | None = None


@dataclass(frozen=True)
class Draining:
    """No state change: a stop/switch waits for the answers in flight (docs/engine.md "Keeps serving")."""

    draining: bool
    in_flight: int = 0
    deadline: float = 0.0
    expected_back_s: float = 0.0  # the gateway's Retry-After until the engine serves again (0: unknown/never)


@dataclass(frozen=True)
class Noted:
    """No state change: a message and/or the last diagnosis (e.g. 'rolled back to quality')."""

    message: str
    diagnosis: Diagnosis | None = None


Event = Union[PreflightBegan, BootBegan, BootProgressed, BecameReady, Adopted, StopBegan, Stopped, Failed, Noted,
              Vanished, Stalled, Unstalled, Supervised, Draining]

STOPPED, PREFLIGHT, STARTING, READY, STOPPING, FAILED, STALLED = (
    EngineState.STOPPED, EngineState.PREFLIGHT, EngineState.STARTING, EngineState.READY, EngineState.STOPPING,
    EngineState.FAILED, EngineState.STALLED,
)
ALLOWED: dict[type, frozenset[EngineState]] = {
    PreflightBegan: frozenset({STOPPED, FAILED}),
    BootBegan: frozenset({PREFLIGHT, STOPPED, FAILED}),
    BootProgressed: frozenset({STARTING}),
    BecameReady: frozenset({STARTING}),
    Adopted: frozenset({STOPPED, FAILED, STARTING, READY, STALLED}),
    StopBegan: frozenset({PREFLIGHT, STARTING, READY, STALLED, FAILED}),
    Stopped: frozenset({STOPPING, FAILED, PREFLIGHT}),
    Failed: frozenset({STOPPED, PREFLIGHT, STARTING, READY, STALLED, STOPPING, FAILED}),
    Vanished: frozenset({STARTING, READY, STALLED, STOPPING, FAILED, STOPPED}),
    Stalled: frozenset({READY}),
    Unstalled: frozenset({STALLED}),
    Noted: frozenset(EngineState),
    Supervised: frozenset(EngineState),
    Draining: frozenset(EngineState),
}


def _pointed_at(snap: EngineSnapshot, event: BootBegan | Adopted) -> EngineSnapshot:
    return replace(snap, profile_id=event.profile_id, container_id=event.container_id,
                   container_name=event.container_name, base_url=event.base_url, served_name=event.served_name,
                   simulated=event.simulated, build=event.build, image=event.image)


def _gone(snap: EngineSnapshot, message: str, diagnosis: Diagnosis | None, now: float) -> EngineSnapshot:
    """Stopped here or vanished outside: no container left to point at."""
    return replace(snap, state=EngineState.STOPPED, phase="", container_id="", container_name="", base_url="",
                   pool=None, message=message, diagnosis=diagnosis, since=now)


def transition(snap: EngineSnapshot, event: Event, now: float | None = None) -> EngineSnapshot:
    """Apply one event (`now`: the wall time a changed state is stamped `since`; the clock's when None). Raises
    IllegalTransition when the event is not allowed in this state."""
    if snap.state not in ALLOWED[type(event)]:
        raise IllegalTransition(f"{type(event).__name__} is not allowed in state {snap.state.value}")
    now = time.time() if now is None else now
    if isinstance(event, PreflightBegan):
        return replace(snap, state=EngineState.PREFLIGHT, profile_id=event.profile_id, phase="preflight checks",
                       message="", since=now, diagnosis=None)
    if isinstance(event, BootBegan):
        return replace(_pointed_at(snap, event), state=EngineState.STARTING, phase="container started", pool=None,
                       message="", diagnosis=None, since=now)
    if isinstance(event, BootProgressed):
        return replace(snap, phase=event.phase, pool=event.pool,
                       message=event.message or snap.message)
    if isinstance(event, BecameReady):
        return replace(snap, state=EngineState.READY, phase="ready", message=event.message, since=now,
                       last_ready_profile=snap.profile_id, expected_back_s=0.0)
    if isinstance(event, Adopted):
        return replace(
            _pointed_at(snap, event), state=EngineState.READY if event.ready else EngineState.STARTING,
            phase="ready" if event.ready else event.phase, pool=event.pool, diagnosis=None, since=now,
            message=event.message, last_ready_profile=event.profile_id if event.ready else snap.last_ready_profile,
            expected_back_s=0.0 if event.ready else snap.expected_back_s,
        )
    if isinstance(event, StopBegan):
        # the drain that came before is over (drain.Drain._hold kept it marked until now)
        return replace(snap, state=EngineState.STOPPING, phase="stopping", message=event.message, since=now,
                       draining=False, drain_in_flight=0, drain_deadline=0.0)
    if isinstance(event, Stopped):
        return _gone(snap, event.message, snap.diagnosis, now)
    if isinstance(event, Failed):
        cid = snap.container_id if event.container_id is None else event.container_id
        name = snap.container_name if event.container_name is None else event.container_name
        return replace(snap, state=EngineState.FAILED, phase="", diagnosis=event.diagnosis, container_id=cid,
                       container_name=name, message=event.message or event.diagnosis.title, since=now,
                       expected_back_s=0.0)
    if isinstance(event, Vanished):
        return _gone(snap, event.message, event.diagnosis, now)
    if isinstance(event, Stalled):
        return replace(snap, state=EngineState.STALLED, phase="stalled", diagnosis=event.diagnosis,
                       message=event.message or event.diagnosis.title, since=now, stalls_total=snap.stalls_total + 1)
    if isinstance(event, Unstalled):
        return replace(snap, state=EngineState.READY, phase="ready", diagnosis=None, message=event.message, since=now)
    if isinstance(event, Supervised):
        changes = {k: v for k, v in vars(event).items() if v is not None}
        return replace(snap, **changes)
    if isinstance(event, Draining):
        return replace(snap, draining=event.draining, drain_in_flight=event.in_flight, drain_deadline=event.deadline,
                       expected_back_s=event.expected_back_s)
    if isinstance(event, Noted):
        return replace(snap, message=event.message, diagnosis=event.diagnosis or snap.diagnosis)
    raise IllegalTransition(f"unknown event {event!r}")
