"""The controller's shared parts: the fields every seam reads and the calls one seam makes into another.

`EngineController` (controller.py) is assembled from one class per job (docs/engine.md, "Module map"):
reconciler (inbox, write, publish; no I/O), observer (Docker events, resync, adoption, exit explanation),
operations (admission, tickets, start/stop/switch, drain), boot (preflight, run, gate, stop and release),
liveness (stall check, canary) and supervisor (desired state vs the snapshot -> restart, bring back, give up).
They all derive from `Core`, which declares the state they share and stubs the calls that cross a seam, so
each part type-checks on its own.
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable

from app.backend.contracts import AnswerCounter, Diagnosis, EngineSnapshot, GpuReader
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.supervision.canary import CanaryState
from app.backend.engine.supervision.desired import DesiredStore
from app.backend.engine.errlog import ErrorsOnce
from app.backend.engine.decider.events import EventBus
from app.backend.engine.logs.exits import ExitRecords
from app.backend.engine.logs.following import LogFollower
from app.backend.engine.lifecycle.drainnote import DrainNotes
from app.backend.engine.supervision.history import SupervisionStore
from app.backend.engine.decider import facts
from app.backend.engine.decider.inbox import Inbox, Reply
from app.backend.engine.supervision.stall import LivenessTracker
from app.backend.engine.logs.logstore import LogStore
from app.backend.engine.lifecycle.tickets import ControllerOptions, Ticket
from app.backend.engine.lifecycle.oplock import EngineLock
from app.backend.engine.lifecycle.preflight import PreflightReport
from app.backend.engine.supervision.restartpolicy import RestartPolicy
from app.backend.engine.runtime.base import EventStream, Instance, Runtime
from app.backend.recipe.command import RunSpec
from app.backend.recipe.schema import ProfileSpec, Recipe
from app.backend.config.settings import Settings

MUTATING = facts.MUTATING  # "adopt" only watches: no lock


class Core:
    """Declared state of the controller (set in `EngineController.__init__`) and the cross-seam calls."""

    settings: Settings
    recipe: Recipe
    options: ControllerOptions
    logs: LogStore
    oplock: EngineLock
    events: EventBus
    desired_store: DesiredStore
    history: SupervisionStore
    drain_notes: DrainNotes  # this engine's drain, for the other processes (drainnote.py)
    canary_in_flight: threading.Event
    _runtime: Runtime | None
    _runtime_error: str
    _runtime_tried: float
    _runtime_factory: Callable[[], tuple[Runtime | None, str]] | None
    _gpu: GpuReader | None
    _profiles_fn: Callable[[], list[ProfileSpec]]
    _ensure_image: Callable[[Runtime], None] | None
    _artifact_status: Callable[[str], str | None] | None
    _lock: threading.RLock
    _changed: threading.Condition
    _snap: EngineSnapshot  # the decider's snapshot (`_decided.snap`), written with it by the reconciler only
    _decided: facts.Decided  # all a rule reads (decider/step.py): written by the reconciler only
    _busy: Ticket | None  # the admitted operation (admission and waiting; rules read `_decided.op`)
    _wake: threading.Event
    _cancel: threading.Event
    _closed: bool
    _expected_exit: set[str]
    _pids_cache: tuple[float, str, set[int]]
    _follower: LogFollower
    _exit_records: ExitRecords
    _explained: set[str]
    _inbox: Inbox  # the reconciler's: Propose and Close only
    _obs: Inbox  # the observer's: Kick, SyncForOp, Resync, Close
    _wake_watch: threading.Event
    _events_stream: EventStream | None
    _threads: list[threading.Thread]
    _ids: "itertools.count[int]"
    _reconciler: threading.Thread
    _observer: threading.Thread
    _beat: float
    _liveness: LivenessTracker
    _canary: CanaryState
    _canary_for: str
    _canary_retry_at: float
    _stall_source: str
    _last_exit: Instance | None
    _op_listeners: list[Callable[[Ticket], None]]
    _counters: list[AnswerCounter]
    _drain_now: threading.Event
    _drain_carry: float  # the deadline of a drain a stop cancelled: that stop's own drain keeps it
    _wish_lock: threading.Lock  # a recorded wish and the supervisor's read of the files never interleave
    _running_seen: dict[str, float]
    _docker_away_at: float
    _errors: ErrorsOnce  # caught errors, each logged once

    # -- cross-seam calls (each implemented by one part) --------------------------------------
    def _post(self, fact: facts.Fact, *, wait: bool = True) -> Reply:
        raise NotImplementedError

    def _propose(self, fact: facts.Fact, *, wait: bool = True) -> tuple[bool, EngineSnapshot]:
        raise NotImplementedError

    def _apply(self, event: sm.Event) -> EngineSnapshot:
        raise NotImplementedError

    def _writing(self) -> bool:
        raise NotImplementedError

    def _caught(self, context: str, exc: BaseException, *, traceback: bool = False, level: int = 30) -> None:
        raise NotImplementedError

    def _recovered(self, context: str) -> bool:
        raise NotImplementedError

    def _reconcile_now(self) -> None:
        raise NotImplementedError

    def _labels(self) -> dict[str, str]:
        raise NotImplementedError

    def _list_mine(self, rt: Runtime) -> list[Instance]:
        raise NotImplementedError

    def _address(self) -> str:
        raise NotImplementedError

    def _supervise(self) -> None:
        raise NotImplementedError

    def _restart_stalled(self, profile_id: str) -> None:
        raise NotImplementedError

    def _submit(self, action: str, profile_id: str | None, fn: Callable[[Ticket], None]) -> Ticket:
        raise NotImplementedError

    def _finish(self, ticket: Ticket, ok: bool) -> None:
        raise NotImplementedError

    def _fail(self, d: Diagnosis, message: str) -> None:
        raise NotImplementedError

    def _ask(self, fact: facts.Fact) -> facts.Command:
        raise NotImplementedError

    def _boot(self, profile_id: str, spec: RunSpec, overrides: frozenset[str]) -> bool:
        raise NotImplementedError

    def _boot_profile(self, profile_id: str, build: str | None = None) -> bool:
        raise NotImplementedError

    def _await_ready(self, rt: Runtime, inst: Instance, env: dict[str, str], *, watch_only: bool = False) -> bool:
        raise NotImplementedError

    def _stop_engine(self, message: str, release_pids: set[int] | None = None) -> bool:
        raise NotImplementedError

    def _stop_and_release(self, message: str) -> bool:
        raise NotImplementedError

    def _preflight(self, spec: RunSpec, overrides: frozenset[str]) -> PreflightReport:
        raise NotImplementedError

    def _get_runtime(self, force: bool = False) -> Runtime | None:
        raise NotImplementedError

    def _runtime_failure(self, exc: BaseException) -> Diagnosis:
        raise NotImplementedError

    def snapshot(self) -> EngineSnapshot:
        raise NotImplementedError

    def run_spec(self, profile_id: str, *, plain: bool = False, build: str | None = None) -> RunSpec:
        raise NotImplementedError

    def container_pids(self) -> set[int]:
        raise NotImplementedError

    def restart_policy(self) -> RestartPolicy:
        raise NotImplementedError

    def expected_boot_s(self) -> float:
        raise NotImplementedError
