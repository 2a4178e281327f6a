"""EngineController: the public facade of the engine lifecycle for one recipe — preflight, start/stop/one-click
switch with health gating and a drain, reattach, diagnosis, supervision.

The controller is composed of parts that own their state (docs/engine.md, "Module map"), wired here, each given
its few collaborators: the site (settings, runtime, address), the reconciler (the ONE thread that changes the
engine snapshot: it runs the pure step, decider/step.py, on each fact and makes no I/O), the observer (Docker's
events and reads, adoption, exit explanation), admission and the operations (start/stop/switch on worker
threads, one at a time, the cross-process engine lock), boot (preflight, run, gate, stop), the drain, the
supervisor (the wish and the history, its restart operations) and liveness (the stall rule, the canary). The
workers only post facts and carry out the commands that come back; every ask has a deadline. Closing the
controller stops its threads, never the engine.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Callable

from app.backend import oplog
from app.backend.contracts import AnswerCounter, EngineSnapshot, EngineState, GpuReader, LogLine
from app.backend.engine.control.admission import Admission
from app.backend.engine.control.boot import Boot
from app.backend.engine.control.drain import Drain
from app.backend.engine.control.reconciler import Reconciler
from app.backend.engine.control.site import Site
from app.backend.engine.control.supervisor import Supervisor, Wishes
from app.backend.engine.supervision.desired import Desired, DesiredStore
from app.backend.engine.decider.events import EngineChanged, EventBus, SnapshotWatch, Subscription
from app.backend.engine.errlog import ErrorsOnce
from app.backend.engine.logs.exits import ExitRecords
from app.backend.engine.logs.following import LogFollower
from app.backend.engine.lifecycle.drainnote import DrainNotes
from app.backend.engine.supervision.history import SupervisionStore
from app.backend.engine.decider import facts
from app.backend.engine.control.livewatch import Liveness
from app.backend.engine.logs.loglines import EVERY_LINE, LogFilter
from app.backend.engine.logs.logstore import LogStore
from app.backend.engine.control.observer import Observer
from app.backend.engine.control.operations import Operations
from app.backend.engine.lifecycle.tickets import ControllerOptions, Ticket, expects_pool
from app.backend.engine.lifecycle.oplock import EngineLock, Holder
from app.backend.engine.lifecycle.preflight import PreflightReport
from app.backend.engine.supervision.restartpolicy import RestartPolicy
from app.backend.engine.runtime.base import Instance, Runtime
from app.backend.web.exports import exports_dir
from app.backend.recipe.command import RunSpec
from app.backend.recipe.schema import ProfileSpec
from app.backend.config.settings import Settings

__all__ = ["ControllerOptions", "EngineController", "engine_state_dir", "expects_pool"]


def engine_state_dir(state_dir: Path, gpu: int | None) -> Path:
    """Where the engine of GPU `gpu` keeps its own records: the state dir, or `<state dir>/gpu<N>` for N > 0."""
    return state_dir / f"gpu{gpu}" if gpu else state_dir

BOOTING = frozenset({EngineState.PREFLIGHT, EngineState.STARTING})


class EngineController:
    """Single owner of the engine lifecycle for one recipe: the facade over its parts (the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        runtime: Runtime | None = None,
        *,
        runtime_factory: Callable[[], tuple[Runtime | None, str]] | None = None,
        gpu_reader: GpuReader | None = None,
        profiles_fn: Callable[[], list[ProfileSpec]] | None = None,
        options: ControllerOptions | None = None,
        ensure_image: Callable[[Runtime], None] | None = None,
        artifact_status: Callable[[str], str | None] | None = None,
    ) -> None:
        self.settings = settings
        self.recipe = settings.recipe
        self.options = options or ControllerOptions()
        self.site = Site(settings, self.options, runtime, runtime_factory,
                         profiles_fn or (lambda: list(settings.recipe.profiles)))
        # GPU N > 0 of a box of several keeps its log, lock, desired state, restart and exit records apart
        # (docs/engine.md "Several GPUs"); GPU 0 and a one-GPU box use the state dir itself, as before.
        own_dir = engine_state_dir(settings.state_dir, self.options.gpu)
        if own_dir != settings.state_dir:
            own_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        # the records on disk, shared by every process on the data dir
        self.logs = LogStore(own_dir / "engine-logs")
        self.oplock = EngineLock(own_dir)
        self.desired_store = DesiredStore(own_dir)
        self.history = SupervisionStore(own_dir)
        self.drain_notes = DrainNotes(own_dir)
        exit_records = ExitRecords(own_dir)
        self.events = EventBus()  # every applied change, to subscribers (docs/engine.md, "events out")
        errors = ErrorsOnce()  # caught errors, each logged once
        # the signals: closing (every loop ends), a stop's cancel and the wake of an operation's waits
        self._closing, cancel, self._wake = threading.Event(), threading.Event(), threading.Event()
        wake = self._wake
        d0 = self.desired_store.read()
        snap0 = EngineSnapshot(simulated=settings.recipe.simulated, served_name=settings.recipe.model.served_name)
        # the wish the supervisor starts from (no thread runs yet: the reconciler's state is set before it starts)
        self._rec = Reconciler(facts.Decided(snap0, wish_since=d0.since if d0 else 0.0), self.events)
        self._follower = LogFollower(self.logs, booting=lambda: self._rec.snapshot().state in BOOTING,
                                     on_boot_progress=lambda cid, p: self._observer.on_boot_progress(cid, p),
                                     on_ended=lambda cid: self._observer.on_streams_ended(cid))
        self._observer = Observer(self.site, self._rec, self._follower, self.logs, exit_records, self.drain_notes,
                                  errors, self._closing)
        self._drain = Drain(self.site, self._rec, self.drain_notes, errors, cancel=cancel, closing=self._closing)
        self._boot = Boot(self.site, self._rec, self._follower, self.logs, gpu_reader=gpu_reader,
                          history=self.history, exit_records=exit_records, note_exit=self._observer.note_exit,
                          kick=self._observer.kick, cancel=cancel, wake=wake, closing=self._closing,
                          ensure_image=ensure_image, artifact_status=artifact_status)
        self._admission = Admission(self.site, self._rec, self.oplock, errors, cancel=cancel, wake=wake,
                                    closing=self._closing, fail=self._boot.fail, end_drain=self._drain.end_note,
                                    kick=self._observer.kick)
        wishes = Wishes(self.desired_store, self._rec, errors, self.options.actor)
        self._ops = Operations(self.site, self._rec, self._admission, self._boot, self._drain, self._observer,
                               wishes, self.history)
        self._supervisor = Supervisor(self.site, self._rec, self._admission, self._boot, self._observer, wishes,
                                      self.history, self._closing)
        self._liveness = Liveness(self.site, self._rec, self.logs, self._supervisor, errors, self._closing)
        self.canary_in_flight = self._liveness.canary_in_flight  # set while a canary request is out
        self._rec.start()
        self._observer.start(after_pass=self._supervisor.supervise, watch_boot=self._ops.watch_boot)
        self._rec.apply(self._supervisor.supervision_fields(d0))
        if self.options.reattach:
            self._observer.resync()
            self._observer.start_pump()
            self._liveness.start()

    # == public API ===========================================================================
    def snapshot(self) -> EngineSnapshot:
        """The snapshot the reconciler last wrote: an immutable object, read without a lock (one reference)."""
        return self._rec.snapshot()

    def heartbeat(self) -> float:
        """time.monotonic() of the reconciler loop's last turn (the systemd watchdog reads it)."""
        return self._rec.heartbeat()

    def wait_for(self, pred: Callable[[EngineSnapshot], bool], timeout: float) -> EngineSnapshot:
        """Block until pred(snapshot) holds or the timeout passes; returns the last snapshot."""
        return self._rec.wait_for(pred, timeout)

    def subscribe(self, maxsize: int = 256) -> Subscription:
        """A queue of every change from now on (`.get(timeout)`, `.close()` to unsubscribe)."""
        return self.events.subscribe(maxsize)

    def on_change(self, cb: Callable[[EngineChanged], None], name: str = "engine-listener") -> Callable[[], None]:
        """Call `cb(EngineChanged)` for every change, on a thread of its own; returns the unsubscribe function."""
        return self.events.subscribe_callback(cb, name)

    def watch(self, on_change: Callable[[], None] | None = None) -> SnapshotWatch:
        """The newest snapshot and its event seq, kept by the publisher (`.close()` to unsubscribe); no change
        falls between the snapshot it starts from and the first event it gets."""
        return self._rec.watch(on_change)

    def add_log_listener(self, cb: Callable[[LogLine], None]) -> Callable[[], None]:
        return self.logs.add_listener(cb)

    def add_op_listener(self, cb: Callable[[Ticket], None]) -> None:
        """`cb(ticket)` after each operation this process ran has finished (on the operation's thread)."""
        self._admission.add_listener(cb)

    def recent_logs(self, n: int = 250) -> list[LogLine]:
        return self.logs.recent(n)

    def export_logs(self, view: LogFilter = EVERY_LINE) -> Path:
        """Write the in-memory tail, as the view filters it, to a file for download; returns its path."""
        lines = view.apply(self.logs.recent(100000))
        out_dir = exports_dir(self.settings.state_dir)
        snap = self.snapshot()
        path = out_dir / f"engine-{snap.container_name or 'log'}-{time.strftime('%Y%m%dT%H%M%S')}.log"
        path.write_text("".join(f"[{ln.stream}] {ln.text}\n" for ln in lines), encoding="utf-8")
        return path

    def busy(self) -> Ticket | None:
        return self._admission.busy()

    def lock_holder(self) -> Holder | None:
        """Who holds the engine lock now (this or another process), None when free. Read-only."""
        return self.oplock.holder()

    def refresh(self) -> EngineSnapshot:
        """Re-read Docker now (the observer does this on every event and every resync_s)."""
        self._observer.resync()
        return self.snapshot()

    @property
    def runtime(self) -> Runtime | None:
        return self.site.get_runtime()

    @property
    def runtime_error(self) -> str:
        return self.site.runtime_error

    def profiles(self) -> list[ProfileSpec]:
        return self.site.profiles()

    def run_spec(self, profile_id: str, *, plain: bool = False, build: str | None = None) -> RunSpec:
        """The spec a start of this profile runs (site.py: the one place it is built)."""
        return self.site.run_spec(profile_id, plain=plain, build=build)

    def log_tail(self, container_id: str, n: int) -> list[tuple[str, str]]:
        """The last `n` lines of that run's stdout then stderr (the telemetry seeds a run it did not see boot)."""
        rt = self.site.runtime
        return list(rt.tail_logs(container_id, n)) if rt is not None else []

    def container_pids(self) -> set[int]:
        return self._boot.container_pids()

    def preflight(self, profile_id: str | None = None, overrides: frozenset[str] | set[str] = frozenset()) -> PreflightReport:
        pid = profile_id or self.snapshot().profile_id or self.recipe.recommended_profile.id
        return self._boot.preflight(self.run_spec(pid), frozenset(overrides))

    def start(self, profile_id: str, overrides: tuple[str, ...] | frozenset[str] = (), *,
              who: str = oplog.PANEL, build: str | None = None) -> Ticket:
        """Start a profile (`who` asked: oplog.user(name), oplog.CLI, ...; logged with the decision) on `build`
        (None: the current build)."""
        return self._ops.start(profile_id, frozenset(overrides), who, build)

    def stop(self, *, who: str = oplog.PANEL) -> Ticket:
        """Stop the engine: a serving one first drains its answers in flight; a start/switch still booting is
        cancelled first (stop wins)."""
        return self._ops.stop(who)

    def switch(self, profile_id: str, overrides: tuple[str, ...] | frozenset[str] = (), *,
               who: str = oplog.PANEL, build: str | None = None) -> Ticket:
        """Switch to a profile (on `build`; None: the current build): drain, stop, boot the new one (rollback to
        the last ready one if it fails)."""
        return self._ops.switch(profile_id, frozenset(overrides), who, build)

    def desired(self) -> Desired | None:
        """What should run, as recorded on disk by the last start/stop/switch of any panel or CLI."""
        return self.desired_store.read()

    def restart_policy(self) -> RestartPolicy:
        """The effective policy: MOET_PANEL_ENGINE_RESTART, else the panel's setting, else the recipe's."""
        return self._supervisor.restart_policy()

    def stopped_by_reboot(self, inst: Instance | None) -> bool:
        return self._supervisor.stopped_by_reboot(inst)

    def set_canary_interval(self, interval_s: float) -> None:
        """Change the generation canary's interval now (0 = off); the next liveness pass uses it."""
        self._liveness.canary.interval_s = max(0.0, interval_s)

    def canary_counts(self) -> tuple[int, int, int]:
        """(sent, yielded to a user request, failures in a row) since this run became ready."""
        c = self._liveness.canary
        return c.sent, c.yielded, c.failures

    def add_answer_counter(self, counter: AnswerCounter) -> None:
        """Something that streams answers (the gateway, the Chat tab): a stop or switch waits for its answers in
        flight to finish, up to the drain grace (docs/engine.md "Keeps serving")."""
        self._drain.add_counter(counter)

    def switch_now(self) -> None:
        """End the drain of the stop/switch under way at once (the Engine tab's "Switch now")."""
        self._drain.switch_now()

    def drain_grace_s(self) -> float:
        """Seconds a stop/switch waits for the answers in flight: options, else the Service tab, else the recipe."""
        return self._drain.grace_s()

    def expected_boot_s(self, profile_id: str | None = None) -> float:
        """Seconds until the engine serves again after a stop of the current run (history.py; 0: never measured)."""
        return self._ops.expected_boot_s(profile_id)

    def close(self) -> None:
        """Stop the panel's threads. The engine keeps running (it outlives the panel)."""
        self._closing.set()
        self._wake.set()
        self._drain.switch_now()
        self._rec.close()
        self._observer.close()
        self._follower.end()
        self._liveness.join(3)
        self._observer.join(3)
        self._rec.join(3)  # (close() from a change callback or the reconciler itself joins no thread of its own)

    def describe_runtime(self) -> str:
        """Cheap text for the UI (never contacts the daemon)."""
        rt = self.site.runtime
        return rt.describe() if rt is not None else (self.site.runtime_error or "not connected yet")
