"""EngineController: the public facade of the engine lifecycle for one recipe — preflight, start/stop/one-click
switch with health gating and a drain, reattach, diagnosis, supervision.

Threading model (docs/engine.md, "One writer, events out"): ONE thread, the reconciler (`engine-reconciler`,
reconciler.py), is the only code that changes the engine snapshot, and it makes no I/O. Everyone else sends it
proposals: the callers of start/stop/switch (the recorded intent), the operation workers (operations.py,
boot.py; one at a time, single-flight, the cross-process engine lock), the observer (`engine-observer`,
observer.py: Docker events, resync, adoption, exit explanation, then the supervisor, supervisor.py), the log
follower (boot phases) and the liveness/canary thread (livewatch.py). A proposal carries a rule the
reconciler evaluates against the snapshot of that moment, so "only if the engine still shows this container"
never races; every ask has a deadline. Closing the controller stops its threads, never the engine.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from app.backend import oplog
from app.backend.engine.builds import store as builds
from app.backend.contracts import LIVE_STATES, AnswerCounter, EngineSnapshot, EngineState, GpuReader, LogLine
from app.backend.engine.control.boot import Boot
from app.backend.engine.control.core import MUTATING
from app.backend.engine.supervision.canary import CanaryState
from app.backend.engine.supervision.desired import Desired, DesiredStore
from app.backend.engine.decider.events import EngineChanged, EventBus, SnapshotWatch, Subscription
from app.backend.engine.errlog import ErrorsOnce
from app.backend.engine.logs.exits import ExitRecords
from app.backend.engine.logs.following import LogFollower
from app.backend.engine.lifecycle.drainnote import DrainNotes
from app.backend.engine.supervision.history import SupervisionStore
from app.backend.engine.decider import facts
from app.backend.engine.decider.inbox import Close, Inbox, Propose
from app.backend.engine.control.livewatch import LivenessWatch
from app.backend.engine.supervision.stall import LivenessTracker
from app.backend.engine.logs.loglines import EVERY_LINE, LogFilter
from app.backend.engine.logs.logstore import LogStore
from app.backend.engine.control.observer import Observer
from app.backend.engine.control.operations import Operations
from app.backend.engine.lifecycle.tickets import ControllerOptions, Ticket, expects_pool
from app.backend.engine.lifecycle.oplock import EngineLock, Holder, LockHeld
from app.backend.engine.lifecycle.preflight import PreflightReport
from app.backend.engine.supervision.restartpolicy import RestartPolicy, parse_policy
from app.backend.engine.runtime.base import Runtime, RuntimeOpError, RuntimeUnavailable
from app.backend.web.exports import exports_dir
from app.backend.recipe.command import RunSpec, build_run_spec
from app.backend.recipe.schema import ProfileSpec
from app.backend.config.settings import Settings

__all__ = ["ControllerOptions", "EngineController", "engine_state_dir", "expects_pool"]


def engine_state_dir(state_dir: Path, gpu: int | None) -> Path:
    """Where the engine of GPU `gpu` keeps its own records: the state dir, or `<state dir>/gpu<N>` for N > 0."""
    return state_dir / f"gpu{gpu}" if gpu else state_dir

BOOTING = frozenset({EngineState.PREFLIGHT, EngineState.STARTING})


class EngineController(Operations, Boot, LivenessWatch, Observer):
    """Single owner of the engine lifecycle for one recipe (see the module docstring)."""

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
        self._runtime = runtime
        self._runtime_error = ""
        self._runtime_tried = 0.0
        self._runtime_factory = runtime_factory
        self._gpu = gpu_reader
        self._profiles_fn = profiles_fn or (lambda: list(settings.recipe.profiles))
        self._ensure_image = ensure_image
        self._artifact_status = artifact_status
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._snap = EngineSnapshot(simulated=settings.recipe.simulated, served_name=settings.recipe.model.served_name)
        self._decided = facts.Decided(self._snap)  # the reconciler's: all its rules read (decider/step.py)
        self._busy: Ticket | None = None
        self._ids = itertools.count(1)
        self._wake = threading.Event()  # interrupts poll waits (close, cancel)
        self._cancel = threading.Event()  # a stop request cancels the boot in progress
        self._closed = False
        self._expected_exit: set[str] = set()
        self._pids_cache: tuple[float, str, set[int]] = (0.0, "", set())
        # GPU N > 0 of a box of several keeps its log, lock, desired state, restart and exit records apart
        # (docs/engine.md "Several GPUs"); GPU 0 and a one-GPU box use the state dir itself, as before.
        own_dir = engine_state_dir(settings.state_dir, self.options.gpu)
        if own_dir != settings.state_dir:
            own_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.logs = LogStore(own_dir / "engine-logs")
        self._follower = LogFollower(self.logs, booting=lambda: self._snap.state in BOOTING,
                                     on_boot_progress=self._on_boot_progress, on_ended=self._on_streams_ended)
        self.oplock = EngineLock(own_dir)
        self._exit_records = ExitRecords(own_dir)
        self._explained: set[str] = set()  # exited containers already explained (never twice)
        # The one writer's inbox (facts) and the observer's (kicks, an operation's "read Docker now").
        self._inbox = Inbox()
        self._obs = Inbox()
        self._wake_watch = threading.Event()
        self._events_stream = None  # docker-py's CancellableStream while the watch reads it
        self._threads: list[threading.Thread] = []
        self._errors = ErrorsOnce()
        self._liveness = LivenessTracker(self._stall_after())
        self._canary = CanaryState(*self._canary_settings())
        self._canary_for = ""  # the container the canary history belongs to
        self._canary_retry_at = 0.0
        self.canary_in_flight = threading.Event()  # set while a canary request is out (bench/canary_cost.py)
        self._stall_source = ""  # "metrics" (tokens froze with requests running) | "canary"
        self.events = EventBus()  # every applied change, to subscribers (docs/engine.md, "events out")
        # Supervision (docs/engine.md, "Keeps serving"): the desired state and the restart history on disk (any
        # process reads them), the restart due, the exit the observer explained last (its container record
        # decides "stopped by the reboot"), when Docker was last unreachable and each run last seen running.
        self.desired_store = DesiredStore(own_dir)
        self.history = SupervisionStore(own_dir)
        self.drain_notes = DrainNotes(own_dir)
        self._last_exit = None
        self._docker_away_at = 0.0
        self._running_seen: dict[str, float] = {}
        self._op_listeners: list[Callable[[Ticket], None]] = []  # told of every finished operation (/metrics counts)
        self._counters: list[AnswerCounter] = []  # what streams answers (gateway, Chat tab): a stop drains them
        self._drain_now = threading.Event()
        self._drain_carry = 0.0
        self._wish_lock = threading.Lock()
        d0 = self.desired_store.read()
        # the wish the supervisor starts from (no thread runs yet: the reconciler's state is set before it starts)
        self._decided = replace(self._decided, wish_since=d0.since if d0 else 0.0)
        self._beat = time.monotonic()
        self._reconciler = threading.Thread(target=self._reconciler_loop, name="engine-reconciler", daemon=True)
        self._reconciler.start()
        self._observer = threading.Thread(target=self._observer_loop, name="engine-observer", daemon=True)
        self._observer.start()
        self._apply(self._supervision_fields(d0))
        if self.options.reattach:
            self._resync()
            self._start_watch()

    def _start_watch(self) -> None:
        for target, name in ((self._events_loop, "engine-events"), (self._liveness_loop, "engine-liveness")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    # == public API ===========================================================================
    def snapshot(self) -> EngineSnapshot:
        """The snapshot the reconciler last wrote: an immutable object, read without a lock (one reference)."""
        return self._snap

    def wait_for(self, pred: Callable[[EngineSnapshot], bool], timeout: float) -> EngineSnapshot:
        """Block until pred(snapshot) holds or the timeout passes; returns the last snapshot."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not pred(self._snap):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)
            return self._snap

    def subscribe(self, maxsize: int = 256) -> Subscription:
        """A queue of every change from now on (`.get(timeout)`, `.close()` to unsubscribe)."""
        return self.events.subscribe(maxsize)

    def on_change(self, cb: Callable[[EngineChanged], None], name: str = "engine-listener") -> Callable[[], None]:
        """Call `cb(EngineChanged)` for every change, on a thread of its own; returns the unsubscribe function."""
        return self.events.subscribe_callback(cb, name)

    def watch(self, on_change: Callable[[], None] | None = None) -> SnapshotWatch:
        """The newest snapshot and its event seq, kept by the publisher (`.close()` to unsubscribe). Made under
        the lock `_write` publishes under: no change falls between the snapshot it starts from and the first
        event it gets."""
        with self._lock:
            return self.events.watch(self._snap, on_change)

    def add_log_listener(self, cb: Callable[[LogLine], None]) -> Callable[[], None]:
        return self.logs.add_listener(cb)

    def add_op_listener(self, cb: Callable[[Ticket], None]) -> None:
        """`cb(ticket)` after each operation this process ran has finished (on the operation's thread)."""
        self._op_listeners.append(cb)

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
        with self._lock:
            return self._busy

    def lock_holder(self) -> Holder | None:
        """Who holds the engine lock now (this or another process), None when free. Read-only."""
        return self.oplock.holder()

    def refresh(self) -> EngineSnapshot:
        """Re-read Docker now (the reconciler does this on every event and every resync_s)."""
        self._resync()
        return self.snapshot()

    @property
    def runtime(self) -> Runtime | None:
        return self._get_runtime()

    @property
    def runtime_error(self) -> str:
        return self._runtime_error

    def profiles(self) -> list[ProfileSpec]:
        return self._profiles_fn()

    def run_spec(self, profile_id: str, *, plain: bool = False, build: str | None = None) -> RunSpec:
        """The spec a start of this profile runs, panel settings (`options.extra_env`) included: the one place
        it is built, so the Engine and Profiles tabs show exactly what Start runs. `plain`: the card's own
        command (no panel additions), for reading beside the card. `build`: the engine build to run (None: the
        current one, docs/engine.md "Upgrading the engine"). KeyError: unknown profile or build."""
        b = builds.registry(self.settings).resolve(build)
        return build_run_spec(self.recipe, profile_id, str(self.settings.data_dir), plain=plain,
                              extra_env=self.options.extra_env or None, profiles=self.profiles(), image=b.image,
                              build=b.id, gpu=None if plain else self.options.gpu)

    def log_tail(self, container_id: str, n: int) -> list[tuple[str, str]]:
        """The last `n` lines of that run's stdout then stderr (the telemetry seeds a run it did not see boot)."""
        rt = self._runtime
        return list(rt.tail_logs(container_id, n)) if rt is not None else []

    def container_pids(self) -> set[int]:
        snap = self.snapshot()
        rt = self._runtime
        if not snap.container_id or rt is None or snap.state not in LIVE_STATES | {EngineState.STOPPING}:
            return set()
        ts, cid, pids = self._pids_cache
        if cid == snap.container_id and time.monotonic() - ts < 2.0:
            return set(pids)
        try:
            pids = rt.pids(snap.container_id)
        except (RuntimeUnavailable, RuntimeOpError):
            pids = set()
        self._pids_cache = (time.monotonic(), snap.container_id, pids)
        return set(pids)

    def preflight(self, profile_id: str | None = None, overrides: frozenset[str] | set[str] = frozenset()) -> PreflightReport:
        pid = profile_id or self.snapshot().profile_id or self.recipe.recommended_profile.id
        return self._preflight(self.run_spec(pid), frozenset(overrides))


    def start(self, profile_id: str, overrides: tuple[str, ...] | frozenset[str] = (), *,
              who: str = oplog.PANEL, build: str | None = None) -> Ticket:
        """Start a profile (`who` asked: oplog.user(name), oplog.CLI, ...; logged with the decision) on `build`
        (None: the current build)."""
        spec = self._spec_for("start", profile_id, build)
        if isinstance(spec, Ticket):
            return self._intent(spec, "serve", profile_id, who, build)
        if isinstance(verdict := self._ask(facts.MayStart()), facts.EndOp):  # an engine is live: a switch changes it
            return self._intent(self._refused("start", profile_id, verdict.message), "serve", profile_id, who, build)
        t = self._submit("start", profile_id, lambda t: self._op_start(t, profile_id, spec, frozenset(overrides)))
        return self._intent(t, "serve", profile_id, who, build)

    def desired(self) -> Desired | None:
        """What should run, as recorded on disk by the last start/stop/switch of any panel or CLI."""
        return self.desired_store.read()

    def restart_policy(self) -> RestartPolicy:
        """The effective policy: MOET_PANEL_ENGINE_RESTART, else the panel's setting, else the recipe's."""
        fn = self.options.restart_policy_fn
        try:
            return parse_policy(fn()) if fn is not None else self.recipe.engine.restart
        except ValueError:
            return self.recipe.engine.restart

    def set_canary_interval(self, interval_s: float) -> None:
        """Change the generation canary's interval now (0 = off); the next liveness pass uses it."""
        self._canary.interval_s = max(0.0, interval_s)

    def canary_counts(self) -> tuple[int, int, int]:
        """(sent, yielded to a user request, failures in a row) since this run became ready."""
        return self._canary.sent, self._canary.yielded, self._canary.failures

    def add_answer_counter(self, counter: AnswerCounter) -> None:
        """Something that streams answers (the gateway, the Chat tab): a stop or switch waits for its answers in
        flight to finish, up to the drain grace (docs/engine.md "Keeps serving")."""
        self._counters.append(counter)

    def switch_now(self) -> None:
        """End the drain of the stop/switch under way at once (the Engine tab's "Switch now")."""
        self._drain_now.set()

    def stop(self, *, who: str = oplog.PANEL) -> Ticket:
        """Stop the engine: a serving one first drains its answers in flight; a start/switch still booting is
        cancelled first (stop wins)."""
        cancelling: Ticket | None = None
        with self._lock:  # never held while waiting for the reconciler (the intent below waits for it)
            busy = self._busy
            if busy is not None and busy.action != "stop":
                have_lock = False
                if busy.action not in MUTATING:  # only watching (adopt): the engine may be another writer's
                    try:
                        self.oplock.acquire(self.options.actor, "stop")
                        have_lock = True
                    except (LockHeld, OSError) as exc:  # OSError: a full disk cannot take the lock's note
                        return self._intent(self._refused("stop", None, str(exc)), "stopped", None, who)
                # the decider hears of the cancel before the operation's waits wake: what that worker posts next
                # is decided as cancelled (decider/step.py); the events only wake its waits
                self._propose(facts.CancelAsked(busy.id), wait=False)
                self._cancel.set()
                self._wake.set()
                cancelling = Ticket(next(self._ids), "stop", None, True, f"cancelling the {busy.action}, then stopping")
                threading.Thread(target=self._stop_after, args=(busy, cancelling, who, have_lock), name="engine-stop",
                                 daemon=True).start()
        if cancelling is not None:
            return self._intent(cancelling, "stopped", None, who)
        return self._intent(self._submit("stop", None, lambda t: self._op_stop(t, who)), "stopped", None, who)

    def switch(self, profile_id: str, overrides: tuple[str, ...] | frozenset[str] = (), *,
               who: str = oplog.PANEL, build: str | None = None) -> Ticket:
        """Switch to a profile (on `build`; None: the current build): drain, stop, boot the new one (rollback to
        the last ready one if it fails)."""
        spec = self._spec_for("switch", profile_id, build)
        if isinstance(spec, Ticket):
            return self._intent(spec, "serve", profile_id, who, build)
        t = self._submit("switch", profile_id,
                         lambda t: self._op_switch(t, profile_id, spec, frozenset(overrides), who))
        return self._intent(t, "serve", profile_id, who, build)

    def close(self) -> None:
        """Stop the panel's threads. The engine keeps running (it outlives the panel)."""
        self._closed = True
        self._wake.set()
        self._drain_now.set()
        self._inbox.put(Propose(facts.Closing()))
        self._inbox.put(Close())
        self._obs.put(Close())
        self._wake_watch.set()
        with self._lock:
            stream = self._events_stream
        if stream is not None:
            try:
                stream.close()
            except Exception as exc:  # already closed by the daemon: nothing left to end
                self._caught("closing the Docker event stream", exc, level=logging.DEBUG)
        self._follower.end()
        for t in [*self._threads, self._observer, self._reconciler]:
            if t is not threading.current_thread():  # close() from a change callback or the reconciler itself
                t.join(timeout=3)

    def describe_runtime(self) -> str:
        """Cheap text for the UI (never contacts the daemon)."""
        rt = self._runtime
        return rt.describe() if rt is not None else (self._runtime_error or "not connected yet")

