"""EngineController: preflight, start/stop/one-click switch with health gating, reattach, diagnosis.

Threading model (docs/engine.md, "One writer, events out"): ONE thread, the reconciler
(`engine-reconciler`), is the only code that changes the engine snapshot. Everyone else sends it messages
(`inbox.py`): the callers of start/stop/switch (the recorded intent), the operation worker (one at a time,
single-flight; a second request is refused with a refused `Ticket`), the log follower (boot phases), the
liveness/canary thread (stalled, unstalled, canary readings) and the Docker event pump (a kick). A message
that proposes a change carries a rule the reconciler evaluates against the snapshot of that moment, so
"only if the engine still shows this container" never races. The reconciler also re-reads Docker on every
kick and every `resync_s` (docs/engine.md, "One truth") and runs the supervisor. Each applied event goes
through `statemachine.transition()` and is published on the `EventBus`. Mutating operations hold the
cross-process engine lock (`oplock.EngineLock`): a second panel or a CLI is refused, naming the holder.
Long Docker work (run, stop, waiting for health) stays on the worker thread, which reports results as
messages. Closing the controller stops its threads, never the engine.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timezone
import threading
import time
from pathlib import Path
from typing import Callable

import httpx

from app.backend.engine import diagnosis as diag_mod
from app.backend.engine import statemachine as sm
from app.backend.engine.bootlog import BootProgress, BootTracker
from app.backend.engine.diagnosis import cache_miss_warning
from app.backend.engine.canary import CanaryState, Load, canary_diagnosis, load_from_metrics, send_canary
from app.backend.engine.desired import Desired, DesiredKind, DesiredStore
from app.backend.engine.events import EngineChanged, EventBus, SnapshotWatch, Subscription
from app.backend.engine.exits import NEUTRAL_REASONS, ExitRecords, explain_exit, is_failure
from app.backend.engine.restartpolicy import GiveUp, PolicyConfig, Restart, RestartPolicy, decide, parse_policy
from app.backend.engine.following import LogFollower
from app.backend.engine.inbox import Close, Decide, Inbox, Kick, Message, Propose, Reply, Resync, SyncForOp
from app.backend.engine.gpurelease import wait_gpu_release
from app.backend.engine.liveness import LivenessTracker, progress_from_metrics, stall_diagnosis
from app.backend.engine.loglines import EVERY_LINE, LogFilter
from app.backend.engine.logstore import LogStore
from app.backend.engine.ops import ControllerOptions, Ticket, expects_pool
from app.backend.engine.oplock import EngineLock, Holder, LockHeld
from app.backend.engine.preflight import PreflightInputs, PreflightReport, run_preflight
from app.backend.engine.client import base_url, engine_client
from app.backend.engine.readiness import claim_listen_address, probe
from app.backend.exports import exports_dir
from app.backend.engine.runtime import MANAGED_LABEL, RECIPE_LABEL, EventStream, Instance, Runtime, RuntimeOpError, RuntimeUnavailable
from app.backend.contracts import LIVE_STATES, Diagnosis, EngineSnapshot, EngineState, LogLine, slots_of
from app.backend.recipe.command import RunSpec, build_run_spec
from app.backend.recipe.schema import ProfileSpec
from app.backend.settings import Settings
from app.backend.contracts import GpuReader

__all__ = ["ControllerOptions", "EngineController", "expects_pool"]

MUTATING = frozenset({"start", "stop", "switch", "restart"})  # "adopt" only watches: no lock
BOOTING = frozenset({EngineState.PREFLIGHT, EngineState.STARTING})
ADOPT_PROBE_S = 1.0  # adoption's readiness probe: not ready within this -> shown starting, gated by a watch-only op


class EngineController:
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
        self._busy: Ticket | None = None
        self._ids = itertools.count(1)
        self._wake = threading.Event()  # interrupts poll waits (close, cancel)
        self._cancel = threading.Event()  # a stop request cancels the boot in progress
        self._closed = False
        self._expected_exit: set[str] = set()
        self._pids_cache: tuple[float, str, set[int]] = (0.0, "", set())
        self.logs = LogStore(settings.state_dir / "engine-logs")
        self._follower = LogFollower(self.logs, booting=lambda: self._snap.state in BOOTING,
                                     on_boot_progress=self._on_boot_progress, on_ended=self._on_streams_ended)
        self.oplock = EngineLock(settings.state_dir)
        self._exit_records = ExitRecords(settings.state_dir)
        self._explained: set[str] = set()  # exited containers already explained (never twice)
        self._adopted_once = False
        # The one writer (docs/engine.md, "One writer, events out"): its inbox, and the flag it raises while it
        # serves an operation's SyncForOp (that operation asked for Docker's truth: its belief does not win).
        self._inbox = Inbox()
        self._syncing_for_op = False
        self._wake_watch = threading.Event()
        self._events_stream: EventStream | None = None  # docker-py's CancellableStream while the watch reads it
        self._threads: list[threading.Thread] = []
        self._watch_error = ""
        self._liveness = LivenessTracker(self._stall_after())
        self._canary = CanaryState(*self._canary_settings())
        self._canary_for = ""  # the container the canary history belongs to
        self._canary_retry_at = 0.0
        self.canary_in_flight = threading.Event()  # set while a canary request is out (bench/canary_cost.py)
        self._stall_source = ""  # "metrics" (tokens froze with requests running) | "canary"
        self.events = EventBus()  # every applied change, to subscribers (docs/engine.md, "events out")
        # Supervision (docs/engine.md, "Keeps serving"): the desired state on disk, restart history, the exit
        # the reconcile explained last (its container record decides "stopped by the reboot").
        self.desired_store = DesiredStore(settings.state_dir)
        self._restarts_at: list[float] = []
        self._restart_due: tuple[float, str, str] | None = None  # (when, profile, why)
        self._decided_for: tuple[str, float] | None = None  # the failure already decided (container, since)
        self._last_exit: Instance | None = None
        self._op_listeners: list[Callable[[Ticket], None]] = []  # told of every finished operation (/metrics counts)
        self._reconciler = threading.Thread(target=self._reconciler_loop, name="engine-reconciler", daemon=True)
        self._reconciler.start()
        d0 = self.desired_store.read()
        self._apply(sm.Supervised(desired=d0.key if d0 else "", restart_policy=self.restart_policy()))
        if self.options.reattach:
            self._resync()
            self._start_watch()

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

    def run_spec(self, profile_id: str, *, plain: bool = False) -> RunSpec:
        """The spec a start of this profile runs, panel settings (`options.extra_env`) included: the one place
        it is built, so the Engine and Profiles tabs show exactly what Start runs. `plain`: the card's own
        command (no panel additions), for reading beside the card. KeyError: unknown profile."""
        return build_run_spec(self.recipe, profile_id, str(self.settings.data_dir), plain=plain,
                              extra_env=self.options.extra_env or None, profiles=self.profiles())

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

    def _preflight(self, spec: RunSpec, overrides: frozenset[str]) -> PreflightReport:
        rt = self._get_runtime(force=True)
        snap = self.snapshot()
        inputs = PreflightInputs(
            recipe=self.recipe, env=spec.env_dict, data_dir=self.settings.data_dir, runtime=rt,
            runtime_error=self._runtime_error, gpu_reader=self._gpu,
            engine_running=snap.state in LIVE_STATES or self._panel_engine_running(rt),
            engine_pids=self.container_pids(),
            artifact_status=self._artifact_status,
        )
        return run_preflight(inputs, overrides)

    def _panel_engine_running(self, rt: Runtime | None) -> bool:
        """A container with this panel's labels runs (whoever started it): the port holder is ours."""
        try:
            return rt is not None and any(i.running for i in rt.list(self._labels()))
        except (RuntimeUnavailable, RuntimeOpError):
            return False

    def start(self, profile_id: str, overrides: tuple[str, ...] | frozenset[str] = ()) -> Ticket:
        spec = self._spec_for("start", profile_id)
        if isinstance(spec, Ticket):
            return spec
        if self.busy() is None and (why := self._already_live()):
            return self._refused("start", profile_id, why)
        t = self._submit("start", profile_id, lambda t: self._op_start(t, profile_id, spec, frozenset(overrides)))
        return self._intent(t, "serve", profile_id)

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

    def _intent(self, ticket: Ticket, kind: DesiredKind, profile_id: str | None) -> Ticket:
        """An accepted start/stop/switch is the user's intent: persist it (a refused one changes nothing)."""
        if ticket.accepted:
            d = self.desired_store.write(kind, profile_id, self.options.actor)

            def recorded(_: EngineSnapshot) -> list[sm.Event]:  # on the reconciler: the supervisor's bookkeeping
                self._restarts_at.clear()  # a person acted: the cap counts from here
                self._restart_due, self._decided_for = None, None
                return [sm.Supervised(desired=d.key, gave_up=False, restart_try=0)]

            self._propose(recorded)
        return ticket

    def stop(self) -> Ticket:
        """Stop the engine. While a start/switch is booting, the boot is cancelled first (stop wins)."""
        cancelling: Ticket | None = None
        with self._lock:  # never held while waiting for the reconciler (the intent below waits for it)
            busy = self._busy
            if busy is not None and busy.action != "stop":
                have_lock = False
                if busy.action not in MUTATING:  # only watching (adopt): the engine may be another writer's
                    try:
                        self.oplock.acquire(self.options.actor, "stop")
                        have_lock = True
                    except LockHeld as exc:
                        return self._refused("stop", None, str(exc))
                self._cancel.set()
                self._wake.set()
                cancelling = Ticket(next(self._ids), "stop", None, True, f"cancelling the {busy.action}, then stopping")
                threading.Thread(target=self._stop_after, args=(busy, cancelling, have_lock), name="engine-stop",
                                 daemon=True).start()
        if cancelling is not None:
            return self._intent(cancelling, "stopped", None)
        return self._intent(self._submit("stop", None, self._op_stop), "stopped", None)

    def _stop_after(self, busy: Ticket, ticket: Ticket, have_lock: bool = False) -> None:
        busy.wait()
        with self._lock:
            while self._busy is not None:  # another op slipped in; wait for it too
                self._changed.wait(0.5)
            self._busy = ticket
        try:
            if not have_lock:
                self.oplock.acquire(self.options.actor, "stop")
        except LockHeld as exc:  # another process took over between the cancelled op and this stop
            ticket.ok, ticket.message = False, str(exc)
            with self._lock:
                self._busy = None
            ticket._done.set()
            return
        self._run_op(ticket, self._op_stop)

    def switch(self, profile_id: str, overrides: tuple[str, ...] | frozenset[str] = ()) -> Ticket:
        spec = self._spec_for("switch", profile_id)
        if isinstance(spec, Ticket):
            return spec
        t = self._submit("switch", profile_id, lambda t: self._op_switch(t, profile_id, spec, frozenset(overrides)))
        return self._intent(t, "serve", profile_id)

    def _spec_for(self, action: str, profile_id: str) -> RunSpec | Ticket:
        """The operation's one spec (one profile lookup), or its refusal naming the operation."""
        try:
            return self.run_spec(profile_id)
        except (KeyError, ValueError) as exc:
            return self._refused(action, profile_id, f"refused: {exc.args[0] if exc.args else exc}")

    def _already_live(self) -> str:
        """Why a start must be refused now ('' = it may go): an engine already runs (switch changes profile)."""
        snap = self.snapshot()
        if snap.state not in LIVE_STATES:
            return ""
        return (f"refused: an engine is already {snap.state.value} (profile {snap.profile_id}); "
                "use switch to change profile")

    def _refused(self, action: str, profile_id: str | None, message: str) -> Ticket:
        t = Ticket(next(self._ids), action, profile_id, False, message, ok=False)
        t._done.set()
        return t

    def close(self) -> None:
        """Stop the panel's threads. The engine keeps running (it outlives the panel)."""
        self._closed = True
        self._wake.set()
        self._inbox.put(Close())
        self._wake_watch.set()
        with self._lock:
            stream = self._events_stream
        if stream is not None:
            try:
                stream.close()
            except Exception:  # already closed
                pass
        self._follower.end()
        for t in [*self._threads, self._reconciler]:
            if t is not threading.current_thread():  # close() from a change callback or the reconciler itself
                t.join(timeout=3)

    # == operations (worker thread) ===========================================================
    def _submit(self, action: str, profile_id: str | None, fn: Callable[[Ticket], None]) -> Ticket:
        with self._lock:
            if self._closed:
                return self._refused(action, profile_id, "refused: the panel is shutting down")
            if self._busy is not None:
                b = self._busy
                if action in MUTATING and b.action not in MUTATING and (holder := self.oplock.holder()) is not None:
                    return self._refused(action, profile_id, str(LockHeld(holder)))  # the writer whose boot we watch
                what = f"{b.action} to {b.profile_id}" if b.profile_id else b.action
                return self._refused(action, profile_id, f"refused: a {what} is already in progress — wait for it to finish")
            if action in MUTATING:
                try:
                    self.oplock.acquire(self.options.actor, action, profile_id or "")
                except LockHeld as exc:
                    return self._refused(action, profile_id, str(exc))
                except OSError as exc:
                    return self._refused(action, profile_id, f"refused: cannot take the engine lock {self.oplock.path} "
                                                             f"({exc.strerror or exc}); is the data dir writable?")
            ticket = Ticket(next(self._ids), action, profile_id, True, f"{action} accepted")
            self._busy = ticket
        threading.Thread(target=self._run_op, args=(ticket, fn), name=f"engine-{action}", daemon=True).start()
        return ticket

    def _run_op(self, ticket: Ticket, fn: Callable[[Ticket], None]) -> None:
        if ticket.action == "stop":
            self._cancel.clear()
            self._wake.clear()
        try:
            fn(ticket)
        except Exception as exc:  # a bug or a vanished daemon: surface it, never leave the op hanging
            d = self._runtime_failure(exc)
            self._fail(d, f"{ticket.action} failed: {exc}")
            ticket.ok, ticket.diagnosis, ticket.message = False, d, f"{ticket.action} failed: {exc}"
        finally:
            ticket.finished = time.time()
            if ticket.action in MUTATING:
                self.oplock.release()
            with self._lock:
                self._busy = None
                self._changed.notify_all()
            self._inbox.kick()  # re-read Docker now that this process's belief no longer wins
            ticket._done.set()
            for cb in list(self._op_listeners):
                try:
                    cb(ticket)
                except Exception:  # a listener (the /metrics counters) never breaks an operation
                    pass

    def _op_start(self, ticket: Ticket, profile_id: str, spec: RunSpec, overrides: frozenset[str]) -> None:
        self._reconcile_now()  # Docker may show an engine this snapshot did not know of yet
        if why := self._already_live():
            ticket.ok, ticket.message = False, why
            return
        self._finish(ticket, self._boot(profile_id, spec, overrides))

    def _op_stop(self, ticket: Ticket) -> None:
        self._stop_engine("stopped by user" if self.options.actor == "panel" else f"stopped by {self.options.actor}")
        ticket.ok, ticket.message = True, "engine stopped"

    def _op_switch(self, ticket: Ticket, profile_id: str, spec: RunSpec, overrides: frozenset[str]) -> None:
        result = "failed"
        try:
            result = self._switch(ticket, profile_id, spec, overrides)
        finally:  # counted in the snapshot, the one source for /metrics (switches_total{result})
            self._propose(lambda s: [sm.Supervised(switches_ok=s.switches_ok + 1) if result == "ok" else
                                     sm.Supervised(switches_rolled_back=s.switches_rolled_back + 1)
                                     if result == "rolled_back" else
                                     sm.Supervised(switches_cancelled=s.switches_cancelled + 1)
                                     if result == "cancelled" else
                                     sm.Supervised(switches_failed=s.switches_failed + 1)])

    def _switch(self, ticket: Ticket, profile_id: str, spec: RunSpec, overrides: frozenset[str]) -> str:
        """Returns the result label: ok, rolled_back, failed or cancelled."""
        self._reconcile_now()
        snap = self.snapshot()
        if snap.state is EngineState.READY and snap.profile_id == profile_id:
            ticket.ok, ticket.message = True, f"already serving {profile_id}"
            return "ok"
        rollback_to = snap.last_ready_profile
        if not self._stop_and_release(f"switching to {profile_id}"):
            self._finish(ticket, False)
            return "failed"
        if self._boot(profile_id, spec, overrides):
            self._finish(ticket, True)
            return "ok"
        failure = self.snapshot().diagnosis
        if self._cancel.is_set():
            ticket.ok, ticket.message = False, f"switch to {profile_id} cancelled by stop"
            return "cancelled"
        if not (self.options.auto_rollback and rollback_to and rollback_to != profile_id) or self._closed:
            self._finish(ticket, False)
            return "failed"
        self._stop_and_release(f"rolling back to {rollback_to}")
        ok = self._boot_profile(rollback_to)
        title = failure.title if failure else "failed"
        if ok:
            self._apply(sm.Noted(f"switch to {profile_id} failed ({title}); rolled back to {rollback_to}", failure))
            d = self.desired_store.write("serve", rollback_to, f"{self.options.actor} (rollback)")
            self._apply(sm.Supervised(desired=d.key))
        ticket.ok, ticket.diagnosis = False, failure
        ticket.message = (f"switch to {profile_id} failed: {title}; "
                          + (f"rolled back to {rollback_to}" if ok else f"rollback to {rollback_to} failed too"))
        return "rolled_back" if ok else "failed"

    def _finish(self, ticket: Ticket, ok: bool) -> None:
        snap = self.snapshot()
        ticket.ok = ok
        ticket.diagnosis = None if ok else snap.diagnosis
        ticket.message = (f"{snap.profile_id} ready" if ok else
                          f"{ticket.action} failed: {snap.diagnosis.title if snap.diagnosis else snap.message}")

    # -- boot --------------------------------------------------------------------------------
    def _boot_profile(self, profile_id: str) -> bool:
        """Boot a profile the operation did not ask for (rollback, stall restart) from a spec built now."""
        try:
            spec = self.run_spec(profile_id)
        except (KeyError, ValueError) as exc:  # e.g. the custom profile was deleted meanwhile
            d = diag_mod.HINTS["preflight_failed"]
            self._fail(Diagnosis(d.reason, d.title, str(exc), d.fix), f"cannot build {profile_id}: {exc}")
            return False
        return self._boot(profile_id, spec, frozenset())

    def _boot(self, profile_id: str, spec: RunSpec, overrides: frozenset[str]) -> bool:
        """Preflight -> prepare -> run -> gate on ready, all on this one spec. Leaves the state READY or FAILED."""
        self._apply(sm.PreflightBegan(profile_id))
        report = self._preflight(spec, overrides)
        if not report.ok:
            bad = tuple(f"{i.title}: {i.detail} — fix: {i.fix}" for i in report.blocking())
            d = diag_mod.HINTS["preflight_failed"]
            self._fail(Diagnosis(d.reason, d.title, d.explanation, d.fix, bad), "preflight failed: " + report.summary())
            return False
        rt = self._get_runtime(force=True)
        if rt is None:
            self._fail(self._runtime_failure(RuntimeUnavailable(self._runtime_error)), self._runtime_error)
            return False
        hint = self._prepare(rt, spec)
        if hint:
            self._fail(diag_mod.classify(None, False, [], hint=hint[0]), hint[1])
            return False
        try:
            inst = rt.run(spec, self.options.extra_labels)
        except RuntimeOpError as exc:
            self._fail(diag_mod.classify(None, False, [str(exc)], hint=exc.reason), str(exc))
            return False
        self._follower.begin(rt, inst, from_start=True)
        self._apply(sm.BootBegan(profile_id, inst.id, inst.name, base_url(self.recipe, self.settings.data_dir),
                                 self.recipe.model.served_name, self.recipe.simulated))
        return self._await_ready(rt, inst, spec.env_dict)

    def _prepare(self, rt: Runtime, spec: RunSpec) -> tuple[str, str] | None:
        """Clean up our stopped containers; refuse foreign name holders, running twins, a bound port."""
        holder = rt.get(spec.name)
        if holder is not None and not holder.managed:
            return "name_conflict", f"container name {spec.name} is held by a container this panel did not create"
        for inst in rt.list(self._labels()):
            if inst.running:
                return "port_in_use", f"panel engine {inst.name} is still running; stop it first"
            rt.remove(inst.id)
        if busy := claim_listen_address(base_url(self.recipe, self.settings.data_dir)):  # its socket dir, or port
            return "port_in_use", busy
        if not rt.image_present(spec.image):
            if self.recipe.simulated and self._ensure_image is not None:
                self._apply(sm.Noted(f"building the SIMULATED engine image {spec.image}…"))
                self._ensure_image(rt)
            else:
                return "image_missing", f"image {spec.image} is not present"
        return None

    def _await_ready(self, rt: Runtime, inst: Instance, env: dict[str, str], *, watch_only: bool = False) -> bool:
        """Gate on ready. `watch_only` (an adopted engine someone else started): the reconcile keeps running
        meanwhile and owns what happens when Docker changes — this loop ends as soon as the snapshot stops
        showing `inst`, and leaves an exit for the reconcile to explain."""
        url, name = base_url(self.recipe, self.settings.data_dir), self.recipe.model.served_name
        want_pool = expects_pool(env, self.recipe.engine.pool_line)
        deadline = time.monotonic() + self.recipe.engine.boot_timeout_s
        pool_deadline: float | None = None
        while not self._closed and not self._cancel.is_set() and _shows_booting(self._snap, inst.id):
            cur = rt.get(inst.id)
            if cur is None or not cur.running:
                if watch_only:
                    self._inbox.kick()
                    return False
                self._follower.drain()
                return self._fail_exited(cur)
            p = probe(url, name)
            if p.health_ok and p.models_ok:
                prog = self._follower.tracker.progress
                if not want_pool or (slots_of(prog.pool) or 0) > 0:
                    # applied only if the reconciler still shows this run booting (it may have moved on: replaced,
                    # gone) when it reads the message
                    return self._propose(_if_booting(inst.id, sm.BecameReady(self._ready_message(want_pool))))[0]
                pool_deadline = pool_deadline or time.monotonic() + self.options.pool_line_grace_s
                if slots_of(prog.pool) == 0 or time.monotonic() > pool_deadline:
                    return self._fail_and_stop(rt, inst, "pool_not_loaded")
            if time.monotonic() > deadline:
                return self._fail_and_stop(rt, inst, "boot_timeout")
            self._wake.wait(self.options.poll_interval_s)
        return False  # panel closing (engine left as it is), cancelled by stop (the stop op follows), or moved on

    def _ready_message(self, want_pool: bool) -> str:
        prog = self._follower.tracker.progress
        if prog.cache_miss:
            return "ready, but the planes cache MISSED during boot: " + diag_mod.cache_miss_warning()
        return "" if want_pool else "ready (this profile has no FP4 pool)"

    def _fail_exited(self, cur: Instance | None) -> bool:
        lines = [ln.text for ln in self.logs.recent(400)]
        code = cur.exit_code if cur else None
        d = explain_exit(cur, lines, cache_miss=self._follower.tracker.progress.cache_miss)
        self._last_exit = cur
        if cur is not None:
            self._explained.add(cur.id)
        if is_failure(d):
            self._fail(d, f"engine exited (code {code}): {d.title}")
        else:
            self._follower.end()
            self._apply(sm.Vanished(f"engine {d.title}" + (f" (exit code {code})" if code is not None else ""), d))
        return False

    def _fail_and_stop(self, rt: Runtime, inst: Instance, hint: str) -> bool:
        lines = [ln.text for ln in self.logs.recent(400)]
        d = diag_mod.classify(None, False, lines, hint=hint, cache_miss=self._follower.tracker.progress.cache_miss)
        self._expected_exit.add(inst.id)
        rt.stop(inst.id, self.recipe.engine.stop_grace_s)  # it holds the GPU and must not serve
        self._follower.drain()
        self._fail(d, d.title)
        return False

    # -- stop / release ----------------------------------------------------------------------
    def _stop_engine(self, message: str, release_pids: set[int] | None = None) -> bool:
        """Stop every running panel engine of this recipe (normally one) and remove it; with release_pids,
        stay in `stopping` until the GPU reader shows that memory released. False = not released."""
        rt = self._get_runtime(force=True)
        snap = self.snapshot()
        if rt is None:
            if snap.state is not EngineState.STOPPED:
                self._fail(self._runtime_failure(RuntimeUnavailable(self._runtime_error)), self._runtime_error)
            return True
        mine = rt.list(self._labels())
        targets = [i for i in mine if i.running]
        leftovers = [i for i in mine if not i.running]  # e.g. the failed run kept for inspection
        if snap.state is EngineState.STOPPED and not targets:
            for inst in leftovers:
                rt.remove(inst.id)
            return True
        if snap.state is not EngineState.STOPPING:
            self._apply(sm.StopBegan(message))
        stopped = []
        for inst in targets:
            self._expected_exit.add(inst.id)
            final = rt.stop(inst.id, self.recipe.engine.stop_grace_s)
            stopped.append(final or inst)
        self._follower.drain()
        self._follower.end()
        for inst in stopped + leftovers:
            rt.remove(inst.id)  # logs are persisted by the panel; exit code already read
        if release_pids is not None:
            self._apply(sm.Noted(f"{message}: waiting for the GPU memory to be released"))
            if not self._wait_gpu_release(release_pids):
                d = diag_mod.HINTS["gpu_not_released"]
                self._fail(d, d.title)
                return False
        self._apply(sm.Stopped(message))
        return True

    def _stop_and_release(self, message: str) -> bool:
        return self._stop_engine(message, release_pids=self.container_pids())

    def _wait_gpu_release(self, old_pids: set[int]) -> bool:
        """Poll the GPU reader until the old engine's memory is gone (deadline from options)."""
        no_gpu = self.recipe.requirements.gpu_count == 0 and not (self._gpu is not None and self._gpu.simulated)
        return wait_gpu_release(self._gpu, old_pids, threshold=self.options.gpu_release_bytes,
                                timeout_s=self.options.gpu_release_timeout_s,
                                poll_s=min(0.5, self.options.poll_interval_s * 2), stop=self._wake, skip=no_gpu)

    # == observed state: Docker events + periodic resync -> reconcile (docs/engine.md, "One truth") ==
    def _writing(self) -> bool:
        """This process runs a mutating operation: its own belief wins over Docker until it ends — except while
        the reconciler serves that operation's SyncForOp (it asked for Docker's truth). A watch-only op (gating
        an adopted engine) does not count: the reconcile keeps following Docker."""
        busy = self._busy
        return busy is not None and busy.action in MUTATING and not self._syncing_for_op

    def _on_boot_progress(self, cid: str, p: BootProgress) -> None:
        """A followed line moved the boot picture; shown while this run boots (lines before BootBegan are only
        tracked, and shown with the next line)."""
        ev = sm.BootProgressed(p.phase, p.pool, cache_miss_warning() if p.cache_miss else "")
        # fire and forget: a follower thread never waits for the reconciler (which may be draining its streams)
        self._propose(lambda s: [ev] if s.state is EngineState.STARTING and s.container_id == cid else [], wait=False)

    def _on_streams_ended(self, cid: str) -> None:
        """Both log streams ended: the engine probably exited; let the reconcile look at Docker now."""
        if not self._closed:
            self._inbox.kick()

    def _start_watch(self) -> None:
        loops = ((self._events_loop, "engine-events"), (self._liveness_loop, "engine-liveness"))
        for target, name in loops:
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _labels(self) -> dict[str, str]:
        return {MANAGED_LABEL: "1", RECIPE_LABEL: self.recipe.id}

    def _events_loop(self) -> None:
        while not self._closed:
            rt = self._runtime
            try:
                stream = rt.events(self._labels()) if rt is not None else None
                if stream is None:  # no runtime yet, or one without events (process runtime): resync only
                    self._wake_watch.wait(1.0)
                    continue
                with self._lock:
                    self._events_stream = stream
                for _ in stream:  # an observer: it only tells the reconciler to look
                    if self._closed:
                        break
                    self._inbox.kick()
            except Exception:  # daemon restarted / stream cut: the resync covers the gap, retry shortly
                pass
            finally:
                with self._lock:
                    self._events_stream = None
            self._wake_watch.wait(1.0)

    # == the one writer (docs/engine.md, "One writer, events out") ===============================
    def _reconciler_loop(self) -> None:
        """Take messages one at a time; on a kick, and every resync_s without one, re-read Docker and supervise.
        The only thread that calls `_write` (nothing else changes the snapshot)."""
        next_sync = time.monotonic() + self.options.resync_s
        while True:
            timeout: float | None = None  # without the watch (reattach=False): messages only
            if self.options.reattach:
                timeout = max(0.0, next_sync - time.monotonic())
                due = self._restart_due
                if due is not None:
                    timeout = min(timeout, max(0.05, due[0] - time.time()))
            msg = self._inbox.get(timeout)
            if isinstance(msg, Close):
                break
            try:
                if msg is None or isinstance(msg, Kick):
                    if self.options.reattach and not self._closed:
                        self._reconcile()
                        self._supervise()
                        next_sync = time.monotonic() + self.options.resync_s
                else:
                    self._handle(msg)
            except Exception as exc:  # the reconciler must survive anything; say why once
                self._watch_error = f"{type(exc).__name__}: {exc}"
        for left in self._inbox.drain():  # closed: nothing changes any more; release whoever waits
            reply = left.reply if isinstance(left, (Propose, SyncForOp, Resync)) else None
            if reply is not None:
                reply.snap = self._snap
                reply.done.set()

    def _handle(self, msg: Message) -> None:
        """Serve one request (a Propose, an operation's SyncForOp, a Resync); errors go back to the sender."""
        reply = msg.reply if isinstance(msg, (Propose, SyncForOp, Resync)) else None
        try:
            if isinstance(msg, Propose):
                applied, _ = self._decide_and_write(msg.decide)
                if reply is not None:
                    reply.applied = applied
            elif isinstance(msg, SyncForOp):
                self._syncing_for_op = True
                try:
                    self._reconcile()
                finally:
                    self._syncing_for_op = False
            elif isinstance(msg, Resync):
                self._reconcile()
        except Exception as exc:
            if reply is None:
                raise
            reply.error = exc
        finally:
            if reply is not None:
                reply.snap = self._snap
                reply.done.set()

    def _on_reconciler(self) -> bool:
        return threading.current_thread() is self._reconciler

    def _ask(self, msg: Propose | SyncForOp | Resync, reply: Reply) -> Reply:
        """Send and wait for the answer (re-raising its error here). After close: answered with no change."""
        self._inbox.put(msg)
        while not reply.done.wait(0.5):
            if not self._reconciler.is_alive():
                reply.snap = self._snap
                return reply
        if reply.error is not None:
            raise reply.error
        return reply

    def _propose(self, decide: Decide, *, wait: bool = True) -> tuple[bool, EngineSnapshot]:
        """A change for the reconciler: `decide(snapshot)` runs there and returns the events to apply.
        Returns (anything applied, the snapshot after). On the reconciler itself: applied at once."""
        if self._on_reconciler():
            return self._decide_and_write(decide)
        if not wait:
            self._inbox.put(Propose(decide))
            return False, self._snap
        reply = self._ask(Propose(decide, reply := Reply()), reply)
        return reply.applied, reply.snap or self._snap

    def _apply(self, event: sm.Event) -> EngineSnapshot:
        """Propose one event unconditionally; returns the snapshot after it."""
        return self._propose(lambda _: [event])[1]

    def _reconcile_now(self) -> None:
        """Inside an operation: ask the reconciler to read Docker first, so a start/switch acts on the truth."""
        self._ask(SyncForOp(reply := Reply()), reply)

    def _resync(self) -> None:
        if self._on_reconciler():
            self._reconcile()
        else:
            self._ask(Resync(reply := Reply()), reply)

    def _decide_and_write(self, decide: Decide) -> tuple[bool, EngineSnapshot]:
        # under the op-admission lock: a rule that reads `_busy` is atomic with `_submit` setting it
        with self._lock:
            events = list(decide(self._snap))
            for ev in events:
                self._write(ev)
            return bool(events), self._snap

    def _write(self, event: sm.Event) -> EngineSnapshot:
        """The one place the snapshot changes: transition, wake waiters, publish the change (never blocks)."""
        if not self._on_reconciler():
            raise RuntimeError("engine state is written by the reconciler thread only (docs/engine.md)")
        with self._lock:
            before = self._snap
            self._snap = sm.transition(before, event)
            self._changed.notify_all()
            self.events.publish(type(event).__name__, before, self._snap)
            return self._snap

    def _liveness_loop(self) -> None:
        while not self._closed:
            # the canary goes when due, not at the next 1 s tick (detection: docs/engine.md, "Liveness")
            until = self._canary.seconds_until_due(time.monotonic())
            self._wake_watch.wait(max(0.05, min(self.options.liveness_poll_s, until)))
            if self._closed:
                return
            try:
                self._check_liveness()
            except Exception as exc:  # like the reconcile: survive, say why
                self._watch_error = f"{type(exc).__name__}: {exc}"

    def _reconcile(self) -> None:
        """On the reconciler: make the snapshot say what Docker says (skipped while this process runs a mutating
        operation, unless that operation asked: its SyncForOp, at the start of a start/switch)."""
        with self._lock:
            if self._writing() or self._closed:
                return
        rt = self._get_runtime()
        if rt is None:
            return
        try:
            mine = rt.list(self._labels())
        except (RuntimeUnavailable, RuntimeOpError) as exc:
            with self._lock:
                if not self._writing() and self._snap.state in LIVE_STATES:
                    base = Diagnosis("docker_unreachable", "Docker daemon unreachable", str(exc),
                                     "Is dockerd running (`systemctl status docker`)? Is DOCKER_HOST right?")
                    self._apply(sm.Failed(base, str(exc)))
            return
        running = sorted((i for i in mine if i.running), key=lambda i: i.started_at)
        if running:
            self._reconcile_running(rt, running)
        else:
            self._reconcile_nothing_runs(rt, mine)

    def _reconcile_running(self, rt: Runtime, running: list[Instance]) -> None:
        snap = self.snapshot()
        inst = running[-1]
        if snap.container_id == inst.id and snap.state in LIVE_STATES | {EngineState.STOPPING}:
            if snap.state is EngineState.STARTING:
                with self._lock:  # booting and nobody in this process waits for it (adopted inside an op)
                    if self._busy is None:
                        self._watch_boot(rt, inst)
            return
        self._adopt(rt, inst, len(running))

    def _reconcile_nothing_runs(self, rt: Runtime, mine: list[Instance]) -> None:
        """Explain the run the snapshot still shows, or (fresh process) the newest exited run."""
        snap = self.snapshot()
        if snap.state in LIVE_STATES or snap.state is EngineState.STOPPING:
            cid = snap.container_id
        elif snap.state is EngineState.FAILED and snap.container_id:
            if not any(i.id == snap.container_id and i.status != "removing" for i in mine):
                with self._lock:  # the failed run's container was removed: nothing is there; keep why it failed
                    if not self._writing():
                        self._write(sm.Vanished(f"{snap.container_name or 'the engine container'} was removed "
                                                "(the last diagnosis is kept below)", snap.diagnosis))
            return  # already explained
        else:
            exited = sorted((i for i in mine if not i.running), key=lambda i: i.finished_at or i.started_at)
            if not exited or exited[-1].id in self._explained:
                return
            cid = exited[-1].id
        inst_now = next((i for i in mine if i.id == cid), None)
        self._explain(rt, inst_now, cid)

    def _explain(self, rt: Runtime, inst: Instance | None, cid: str) -> None:
        self._explained.add(cid)
        tracker = BootTracker()
        lines: list[str] = []
        if inst is not None:
            self._follower.drain(0.5)  # Docker ends the streams when the container exits: normally at once
            with self._lock:
                followed = bool(self._snap.container_id == cid and self.logs.recent(1))
            lines = ([ln.text for ln in self.logs.recent(400)] if followed
                     else [t for _, t in rt.read_logs(cid, max_lines=20000)])
            for text in lines:
                tracker.feed(text)
        d = self._exit_records.read(cid) or explain_exit(inst, lines[-400:], cache_miss=tracker.progress.cache_miss)
        self._last_exit = inst
        with self._lock:
            if self._writing() or (self._snap.container_id and self._snap.container_id != cid):
                return  # an operation started meanwhile / already on another container
            if inst is None or inst.id == self._snap.container_id:
                self._follower.end()
            code = f" (exit code {inst.exit_code})" if inst is not None else ""
            if is_failure(d):  # the failed run's id stays: it is what the badge explains
                self._apply(sm.Failed(d, f"engine exited{code}: {d.title}", container_id=cid,
                                      container_name=inst.name if inst else ""))
            else:
                self._apply(sm.Vanished(f"engine {d.title}{code}", d))

    def _adopt(self, rt: Runtime, inst: Instance, n_running: int) -> None:
        """Adopt a running panel engine (started by this panel before a restart, another panel or the CLI)."""
        tracker = BootTracker()
        old = rt.read_logs(inst.id, max_lines=20000)
        for _, text in old:
            tracker.feed(text)
        prog = tracker.progress
        # Probe only an engine whose log says its API is up: one still booting is shown starting at once (the
        # watch-only op gates it), never held back by a probe of a busy new process.
        p = probe(base_url(self.recipe, self.settings.data_dir), self.recipe.model.served_name, read_timeout_s=ADOPT_PROBE_S) \
            if prog.api_up else None
        want_pool = expects_pool(inst.env, self.recipe.engine.pool_line)
        ready = p is not None and p.health_ok and p.models_ok and (not want_pool or (slots_of(prog.pool) or 0) > 0)
        with self._lock:
            if self._writing() or self._closed:
                return
            first = self._snap.state is EngineState.STOPPED and not self._snap.container_id and not self._adopted_once
            self._adopted_once = True
            self._follower.begin(rt, inst, from_start=False, tracker=tracker, backlog=old[-300:])
            note = "reattached to the running engine" if first else f"adopted {inst.name} (started outside this panel)"
            self._liveness.reset()
            self._apply(sm.Adopted(inst.profile_id, inst.id, inst.name, base_url(self.recipe, self.settings.data_dir),
                                   self.recipe.model.served_name, self.recipe.simulated, ready, prog.phase,
                                   prog.pool, note))
            if n_running > 1:
                self._apply(sm.Noted(f"adopted {inst.name}; {n_running - 1} other panel engine(s) are also "
                                     "running — stop them (never started twice by this panel)"))
            if not ready and self._busy is None:  # (during an operation's SyncForOp that operation gates it)
                self._watch_boot(rt, inst)

    def _watch_boot(self, rt: Runtime, inst: Instance) -> None:
        """An adopted engine still boots: gate it on ready in a watch-only op (no lock: another writer's run)."""
        self._submit("adopt", inst.profile_id,
                     lambda t: self._finish(t, self._await_ready(rt, inst, inst.env, watch_only=True)))

    # -- liveness after ready (docs/engine.md, "Liveness") ---------------------------------------
    def _check_liveness(self) -> None:
        snap = self.snapshot()
        if snap.state not in (EngineState.READY, EngineState.STALLED) or not snap.base_url or self._busy is not None:
            return
        if snap.container_id != self._canary_for:  # a new run: its own canary history
            self._canary_for = snap.container_id
            # its interval runs from when it became ready, not from this check up to a poll later
            self._canary.reset(time.monotonic() - max(0.0, time.time() - snap.since))
        if snap.state is EngineState.READY:
            self._stall_source = ""
        try:
            # The one engine client's read, shared with the telemetry's scrape of the same second
            # (docs/engine.md, "Engine client"): one GET /metrics a second, not two.
            read = engine_client(snap.base_url).metrics(max_age_s=self.options.liveness_poll_s,
                                                        timeout=httpx.Timeout(2.0, connect=1.0))
            now = time.monotonic()
            verdict = self._liveness.feed(progress_from_metrics(read.text, read.monotonic))
            load = load_from_metrics(read.text)
        except (httpx.HTTPError, ValueError):
            return
        if self._stall_source != "canary" and self._canary_tick(snap, load, now):
            return
        if self._busy is not None or self._snap.container_id != snap.container_id:
            return
        cid = snap.container_id
        if verdict.stalled and self._snap.state is EngineState.READY:
            tail = tuple(ln.text for ln in self.logs.recent(5))
            stalled = sm.Stalled(stall_diagnosis(verdict.running, verdict.idle_s, self._stall_after(), tail),
                                 f"stalled: {int(verdict.running)} request(s) running, no token for "
                                 f"{verdict.idle_s:.0f} s")
            if not self._propose(lambda s: [stalled] if self._still_serving(s, cid, EngineState.READY) else [])[0]:
                return
            self._stall_source = "metrics"
            if self._restart_on_stall() and snap.profile_id:
                self._restart_stalled(snap.profile_id)
        elif (not verdict.stalled and self._snap.state is EngineState.STALLED and self._stall_source == "metrics"
              or self._stall_source == "canary" and self._canary_recovered(snap, load)):
            unstalled = sm.Unstalled("tokens are moving again")
            if self._propose(lambda s: [unstalled] if self._still_serving(s, cid, EngineState.STALLED) else [])[0]:
                self._stall_source = ""

    def _still_serving(self, s: EngineSnapshot, cid: str, state: EngineState) -> bool:
        """A liveness verdict's rule, run on the reconciler: the run it judged is still shown, in `state`, and
        no operation of this process is under way."""
        return self._busy is None and s.container_id == cid and s.state is state

    def _canary_settings(self) -> tuple[float, float]:
        o, e = self.options, self.recipe.engine
        interval = o.canary_interval_s if o.canary_interval_s is not None else (e.canary_interval_s if o.supervise
                                                                                else 0.0)
        return interval, o.canary_timeout_s if o.canary_timeout_s is not None else e.canary_timeout_s

    def _canary_tick(self, snap: EngineSnapshot, load: Load, now: float) -> bool:
        """Send a canary when one is due (idle, no proof for interval_s); True when it judged the engine stalled."""
        if snap.state is not EngineState.READY or not self._canary.due(load, now):
            return False
        while True:
            sent_at = time.monotonic()
            self.canary_in_flight.set()
            try:
                result = send_canary(snap.base_url, snap.served_name, self._canary.timeout_s,
                                     arrived=self._user_arrived)
            finally:
                self.canary_in_flight.clear()
            stalled = self._canary.record(result, sent_at)
            # one failure: the second try goes at once, if still idle (detection <= interval + 2 x timeout)
            if stalled or result.outcome != "failed" or self._user_arrived() or self._closed:
                break
            self._apply(self._canary_event())
        events: list[sm.Event] = [self._canary_event()]
        if stalled:
            tail = tuple(ln.text for ln in self.logs.recent(5))
            events.append(sm.Stalled(canary_diagnosis(result.detail, self._canary.interval_s, tail),
                                     f"stalled: the generation canary failed twice ({result.detail})"))
        cid = snap.container_id
        if not self._propose(lambda s: events if self._still_serving(s, cid, EngineState.READY) else [])[0]:
            return True
        if not stalled:
            return False
        self._stall_source = "canary"
        if self._restart_on_stall() and snap.profile_id:
            self._restart_stalled(snap.profile_id)
        return True

    def _canary_event(self) -> sm.Supervised:
        """The canary's status line and its last judged reading, for the snapshot (and /metrics from it)."""
        c, r = self._canary, self._canary.last
        judged = r is not None and r.outcome != "yielded"
        return sm.Supervised(canary=c.status(), canary_failures_total=c.failures_total,
                             canary_ok=(r.outcome == "ok") if judged and r is not None else None,
                             canary_at=c.last_at if judged else None,
                             canary_latency_s=r.seconds if judged and r is not None else None)

    def _canary_recovered(self, snap: EngineSnapshot, load: Load) -> bool:
        """A canary-stalled engine (restart off) is re-tried every interval; a success ends the stall."""
        if time.monotonic() - self._canary_retry_at < max(self._canary.interval_s, 1.0) or load.waiting or load.running:
            return False
        self._canary_retry_at = time.monotonic()
        r = send_canary(snap.base_url, snap.served_name, self._canary.timeout_s, arrived=self._user_arrived)
        if r.outcome != "ok":
            return False
        self._canary.record(r, time.monotonic())
        self._apply(self._canary_event())
        return True

    def _user_arrived(self) -> bool:
        """While a canary runs: does a request wait (it would wait behind the canary with --max-num-seqs 1)?"""
        url = self._snap.base_url
        try:
            read = engine_client(url).metrics(timeout=httpx.Timeout(1.0, connect=0.5))  # fresh: no max_age_s
            return load_from_metrics(read.text).waiting > 0
        except (httpx.HTTPError, ValueError):
            return False

    def _stall_after(self) -> float:
        v = self.options.stall_after_s
        return float(v if v is not None else self.recipe.engine.stall_after_s)

    def _restart_on_stall(self) -> bool:
        v = self.options.restart_on_stall
        if v is not None:
            return v
        return self.recipe.engine.restart_on_stall or (self.options.supervise and self.restart_policy() == "on-failure")

    # -- supervision (docs/engine.md, "Keeps serving") -------------------------------------------
    def _policy_config(self) -> PolicyConfig:
        o = self.options
        return PolicyConfig(self.restart_policy(), o.restart_max_tries, o.restart_window_s, o.restart_backoff_s)

    def _boot_time(self) -> float:
        fn = self.options.boot_time_fn
        if fn is not None:
            return fn()
        import psutil

        return float(psutil.boot_time())

    def stopped_by_reboot(self, inst: Instance | None) -> bool:
        """The container's run ended with the host: it finished before this boot, or it started before this
        boot and Docker recorded its end only when the daemon came back (FinishedAt at the daemon's restore)."""
        if inst is None or inst.running:
            return False
        boot = self._boot_time()
        started, finished = _iso_ts(inst.started_at), _iso_ts(inst.finished_at)
        return (finished is not None and finished < boot) or (started is not None and started < boot)

    def _supervise(self) -> None:
        """Compare the desired state with the snapshot and act: bring back, restart with backoff, give up, or
        respect an outside stop. Runs in the reconcile thread, after each reconcile; acts through operations."""
        if not self.options.supervise or self._closed:
            return
        desired = self.desired_store.read()
        policy = self.restart_policy()
        with self._lock:
            if self._busy is not None:
                return
            snap = self._snap
            key = desired.key if desired else ""
            if key != snap.desired or policy != snap.restart_policy:
                snap = self._apply(sm.Supervised(desired=key, restart_policy=policy))
        if desired is None or desired.kind == "stopped" or desired.profile_id is None:
            self._restart_due = None
            return
        if snap.state is EngineState.READY and snap.restart_try:
            self._apply(sm.Supervised(restart_try=0))
        if snap.state not in (EngineState.STOPPED, EngineState.FAILED) or snap.gave_up:
            return
        now = time.time()
        due = self._restart_due
        if due is not None:
            if now >= due[0]:
                self._restart_due = None
                self._supervised_restart(due[1], due[2])
            return
        if self._decided_for == (snap.container_id, snap.since):
            return
        self._decided_for = (snap.container_id, snap.since)
        self._decide(snap, desired.profile_id, now)

    def _decide(self, snap: EngineSnapshot, profile_id: str, now: float) -> None:
        reason = snap.diagnosis.reason if snap.diagnosis else ""
        if snap.state is EngineState.STOPPED and not snap.container_id and not reason:
            self._schedule(now, profile_id, f"bringing back {profile_id} (it should run; nothing runs)")
            return
        if self.stopped_by_reboot(self._last_exit):
            self._schedule(now, profile_id, f"bringing back {profile_id} (stopped by the host's reboot)")
            return
        if snap.state is EngineState.STOPPED:
            if reason in NEUTRAL_REASONS:  # a clean outside stop/removal while the host is up: a person's stop
                d = self.desired_store.write("stopped", None, "supervisor (stopped outside the panel)")
                self._apply(sm.Supervised(desired=d.key, restart_try=0,
                                          message=f"{snap.message or 'stopped outside the panel'} — respected: "
                                                  "desired state is now stopped"))
            return
        title = snap.diagnosis.title if snap.diagnosis else snap.message
        verdict = decide(self._policy_config(), reason, self._restarts_at, now)
        if isinstance(verdict, GiveUp):
            self._apply(sm.Supervised(gave_up=True, restart_try=0, message=f"{title} — failed, {verdict.why}"))
        elif isinstance(verdict, Restart):
            self._apply(sm.Supervised(restart_try=verdict.try_no,
                                      message=f"{title} — restarting, try {verdict.try_no} of {verdict.of}"
                                              + (f" in {verdict.delay_s:.0f} s" if verdict.delay_s >= 1 else "")))
            self._schedule(now + verdict.delay_s, profile_id, f"restarting {profile_id} after: {title} "
                                                              f"(try {verdict.try_no} of {verdict.of})")

    def _schedule(self, when: float, profile_id: str, why: str) -> None:
        self._restart_due = (when, profile_id, why)  # on the reconciler: its next wait ends at `when`

    def _supervised_restart(self, profile_id: str, why: str) -> None:
        def op(t: Ticket) -> None:
            self._reconcile_now()
            if self._already_live():  # another panel brought it back first: never a second engine
                t.ok, t.message = True, "already running"
                return
            def counted(s: EngineSnapshot) -> list[sm.Event]:  # on the reconciler: it owns the restart history
                self._restarts_at.append(time.time())
                return [sm.Supervised(restarts_total=s.restarts_total + 1, message=why)]

            self._propose(counted)
            self._finish(t, self._boot_profile(profile_id))

        t = self._submit("restart", profile_id, op)
        if not t.accepted:  # the lock is held by another writer: decide again on the next pass
            self._decided_for = None

    # -- helpers -------------------------------------------------------------------------------

    def _fail(self, d: Diagnosis, message: str) -> None:
        snap = self._apply(sm.Failed(d, message))
        if snap.container_id:  # a run this panel judged (pool not loaded, boot timeout): any process reads it
            self._exit_records.record(snap.container_id, d)

    def _restart_stalled(self, profile_id: str) -> None:
        """restart_on_stall: same profile; the stalled run's log files stay on disk, its diagnosis stays shown."""
        stalled = self.snapshot().diagnosis

        if self.options.supervise:  # the policy's cap counts stall restarts too
            gave_up = False

            def judged(s: EngineSnapshot) -> list[sm.Event]:  # on the reconciler: it owns the restart history
                nonlocal gave_up
                verdict = decide(self._policy_config(), "stalled", self._restarts_at, time.time())
                if isinstance(verdict, GiveUp):
                    gave_up = True
                    return [sm.Supervised(gave_up=True, message=f"stalled — failed, {verdict.why}")]
                if isinstance(verdict, Restart):
                    self._restarts_at.append(time.time())
                    return [sm.Supervised(restarts_total=s.restarts_total + 1, restart_try=verdict.try_no,
                                          message=f"stalled — restarting, try {verdict.try_no} of {verdict.of}")]
                return []

            self._propose(judged)
            if gave_up:
                return

        def op(t: Ticket) -> None:
            if not self._stop_and_release(f"restarting {profile_id}: the engine stalled"):
                self._finish(t, False)
                return
            ok = self._boot_profile(profile_id)
            if ok and stalled is not None:
                self._apply(sm.Noted(f"restarted {profile_id} after a stall (previous run: {stalled.title})", stalled))
            self._finish(t, ok)

        self._submit("restart", profile_id, op)

    def _runtime_failure(self, exc: BaseException) -> Diagnosis:
        if isinstance(exc, RuntimeUnavailable):
            base = diag_mod.HINTS["docker_unreachable"]
            return Diagnosis(base.reason, base.title, str(exc), base.fix)
        return Diagnosis("internal_error", "Panel error during the operation", repr(exc),
                         "Retry; if it persists, report it with the Logs view content.")

    def _get_runtime(self, force: bool = False) -> Runtime | None:
        """The runtime; without one, ask the factory again (operations: always; readers: every 10 s)."""
        if self._runtime is None and self._runtime_factory is not None:
            if force or time.monotonic() - self._runtime_tried >= 10.0 or not self._runtime_error:
                self._runtime_tried = time.monotonic()
                self._runtime, self._runtime_error = self._runtime_factory()
        return self._runtime

    def describe_runtime(self) -> str:
        """Cheap text for the UI (never contacts the daemon)."""
        rt = self._runtime
        return rt.describe() if rt is not None else (self._runtime_error or "not connected yet")


def _shows_booting(snap: EngineSnapshot, cid: str) -> bool:
    """The snapshot shows this container booting (a preflight before BootBegan counts)."""
    return snap.state is EngineState.PREFLIGHT or (snap.state is EngineState.STARTING and snap.container_id == cid)


def _if_booting(cid: str, event: sm.Event) -> Decide:
    """The rule of a boot gate's verdict: apply `event` only while the snapshot shows `cid` booting."""
    return lambda s: [event] if _shows_booting(s, cid) else []


def _iso_ts(text: str) -> float | None:
    """Docker's RFC 3339 time (nanoseconds, 'Z') as a Unix time; None when empty or Docker's zero time."""
    if not text or text.startswith("0001"):
        return None
    try:
        return datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None
