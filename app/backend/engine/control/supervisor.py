"""The supervisor's hands (docs/engine.md, "Keeps serving"): on the observer thread after each pass over Docker,
it reads what should run (desired.py), what was tried (history.py) and two facts of the host, posts them to the
decider as one fact (`SupervisionPass`; the decision is the pure step's, supervision/plan.py) and carries out
the commands that come back: restart, record a give-up, respect a person's outside stop, clear a healed failure.
The stall restart (`restart_stalled`, on the liveness thread) asks the step the same way (`StallRestart`).
`Wishes` owns what should run (desired.py) and the lock that keeps a person's recorded wish and the supervisor's
read of the files apart.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import datetime, timezone

from app.backend import oplog
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.decider.facts import (ClearFailure, Command, CountRestart, EndOp, MayStart, RecordGiveUp,
                                              RespectStop, RestartNow, RestartRefused, RestartStalled, StallRestart,
                                              SupervisionPass, Wish, WishStopped)
from app.backend.engine.control.admission import Admission, ask
from app.backend.engine.control.boot import Boot
from app.backend.engine.control.observer import Observer
from app.backend.engine.control.reconciler import Reconciler, ReconcilerTimeout
from app.backend.engine.control.site import Site
from app.backend.engine.errlog import ErrorsOnce
from app.backend.engine.supervision.desired import Desired, DesiredKind, DesiredStore
from app.backend.engine.supervision.history import Supervision, SupervisionStore
from app.backend.engine.lifecycle.tickets import Ticket
from app.backend.engine.supervision.restartpolicy import PolicyConfig, RestartPolicy, parse_policy
from app.backend.engine.runtime.base import Instance


def iso_ts(text: str) -> float | None:
    """Docker's RFC 3339 time (nanoseconds, 'Z') as a Unix time; None when empty or Docker's zero time."""
    if not text or text.startswith("0001"):
        return None
    try:
        return datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None



def switch_counts(hist: Supervision) -> sm.Supervised:
    """The snapshot's switch counters as the data dir's supervision file has them (history.py)."""
    return sm.Supervised(switches_ok=hist.switch_count("ok"), switches_failed=hist.switch_count("failed"),
                         switches_rolled_back=hist.switch_count("rolled_back"),
                         switches_cancelled=hist.switch_count("cancelled"))

class Wishes:
    """What should run, on disk (any process reads it), and the lock around a wish and the supervisor's read."""

    def __init__(self, store: DesiredStore, rec: Reconciler, errors: ErrorsOnce, actor: str) -> None:
        self.store = store
        self.rec = rec
        self.errors = errors
        self.actor = actor
        self.lock = threading.Lock()  # a recorded wish and the supervisor's read of the files never interleave

    def record(self, kind: DesiredKind, profile_id: str | None, build: str | None) -> None:
        """A person's accepted start/stop/switch. A new wish clears a give-up and restarts the cap (history.py),
        for every process on the data dir: the supervisor derives both from the wish's time."""
        with self.lock:  # the supervisor never publishes what it read of the files before this wish
            d = self.store.write(kind, profile_id, self.actor, build)
            try:
                self.rec.apply(sm.Supervised(desired=d.key, gave_up=False, restart_try=0))
            except ReconcilerTimeout as exc:  # the operation runs regardless; the supervisor re-reads the file
                self.errors.caught("recording the desired state", exc)


class Supervisor:
    """Reads the wish, the history and the host, posts them, and carries out the decider's commands."""

    def __init__(self, site: Site, rec: Reconciler, admission: Admission, boot: Boot, observer: Observer,
                 wishes: Wishes, history: SupervisionStore, closing: threading.Event) -> None:
        self.site, self.options, self.recipe = site, site.options, site.recipe
        self.rec = rec
        self.admission = admission
        self.boot = boot
        self.observer = observer
        self.wishes = wishes
        self.history = history
        self.closing = closing

    def restart_policy(self) -> RestartPolicy:
        """The effective policy: MOET_PANEL_ENGINE_RESTART, else the panel's setting, else the recipe's."""
        fn = self.options.restart_policy_fn
        try:
            return parse_policy(fn()) if fn is not None else self.recipe.engine.restart
        except ValueError:
            return self.recipe.engine.restart

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
        started, finished = iso_ts(inst.started_at), iso_ts(inst.finished_at)
        return (finished is not None and finished < boot) or (started is not None and started < boot)

    def supervision_fields(self, desired: Desired | None) -> sm.Supervised:
        """The snapshot's supervision fields as the files say (any process's wish, restart, give-up or switch)."""
        hist = self.history.read()
        return replace(switch_counts(hist), desired=desired.key if desired else "",
                       restart_policy=self.restart_policy(), restarts_total=hist.restarts_total,
                       gave_up=hist.gave_up_on(desired) is not None)

    def supervise(self) -> None:
        """After each pass over Docker, on the observer thread: read the files and the host, post them to the
        decider (`SupervisionPass`: its pure step decides, supervision/plan.py) and carry out its commands."""
        if not self.options.supervise or self.closing.is_set():
            return
        with self.wishes.lock:  # read and decided together: a click's wish in between is never overwritten
            desired = self.wishes.store.read()
            hist = self.history.read()
            fact = SupervisionPass(
                wish=Wish(desired.kind, desired.profile_id, desired.since) if desired is not None else None,
                files=self.supervision_fields(desired), failure_recorded=hist.gave_up is not None,
                recent=tuple(hist.recent(desired)), policy=self._policy_config(),
                stopped_by_reboot=self.stopped_by_reboot(self.observer.last_exit),
                other_writer=self.admission.oplock.holder() is not None)
            commands = self.rec.post(fact).commands
        for c in commands:
            self._carry_out(c, desired)

    def _carry_out(self, c: Command, desired: Desired | None) -> None:
        """The supervisor's commands: the writes and the operation the decider asked for."""
        if isinstance(c, ClearFailure):
            self.history.clear_failure()
        elif isinstance(c, RestartNow):
            self._supervised_restart(c.profile_id, c.why, capped=c.capped)
        elif isinstance(c, RespectStop):
            with self.wishes.lock:
                now_wish = self.wishes.store.read()
                if now_wish is None or now_wish.since != c.wish_since:
                    return  # a person's wish came meanwhile: it wins over the outside stop
                d = self.wishes.store.write("stopped", None, "supervisor (stopped outside the panel)")
                self.rec.propose(WishStopped(d.since, d.key, c.message))
            oplog.decision("engine", "outside_stop_respected", who=oplog.OUTSIDE, desired=d.key)
        elif isinstance(c, RecordGiveUp) and desired is not None:
            self.history.give_up(desired, c.reason, c.why)
            oplog.decision("engine", "give_up", who=oplog.SUPERVISOR, level=30, profile=desired.profile_id,
                           reason=c.reason, why=c.why)

    def _supervised_restart(self, profile_id: str, why: str, *, capped: bool) -> None:
        def op(t: Ticket) -> None:
            self.observer.sync_for_op()
            if isinstance(verdict := ask(self.rec, MayStart(t.id, "restart")), EndOp):  # another panel brought it back
                t.ok, t.message = verdict.ok, verdict.message  # first (never a second engine), or a stop cancelled it
                return
            hist = self.history.restarted(time.time(), capped=capped)
            self.rec.apply(sm.Supervised(restarts_total=hist.restarts_total, message=why))
            wish = self.wishes.store.read()  # the build asked for comes back, not the current one
            build = wish.build if wish is not None and wish.profile_id == profile_id else None
            oplog.decision("engine", "restart", who=oplog.SUPERVISOR, profile=profile_id, build=build, why=why)
            self.admission.finish(t, self.boot.boot_profile(profile_id, build))

        t = self.admission.submit("restart", profile_id, op)
        if not t.accepted:  # the lock is held by another writer: decide again on the next pass
            self.rec.propose(RestartRefused())

    def restart_stalled(self, profile_id: str) -> None:
        """restart_on_stall (on the liveness thread): the policy's verdict is the step's (`StallRestart`); this
        carries out its commands. Same profile and build; the stalled run's log files stay on disk, its
        diagnosis stays shown."""
        stalled = self.rec.snapshot().diagnosis
        build = self.rec.snapshot().build or None  # the stalled run's build comes back
        desired = self.wishes.store.read() if self.options.supervise else None
        recent = tuple(self.history.read().recent(desired)) if self.options.supervise else ()
        fact = StallRestart(profile_id, recent, self._policy_config() if self.options.supervise else None)
        restart = False
        for c in self.rec.post(fact).commands:
            if isinstance(c, RecordGiveUp):
                if desired is not None:
                    self.history.give_up(desired, c.reason, c.why)
                oplog.decision("engine", "give_up", who=oplog.SUPERVISOR, level=30, profile=profile_id,
                               reason=c.reason, why=c.why)
            elif isinstance(c, CountRestart):  # the policy's cap counts stall restarts too
                hist = self.history.restarted(time.time(), capped=True)
                self.rec.apply(sm.Supervised(restarts_total=hist.restarts_total, restart_try=c.try_no,
                                          message=f"stalled — restarting, try {c.try_no} of {c.of}"))
            elif isinstance(c, RestartStalled):
                restart = True
        if not restart:
            return
        oplog.decision("engine", "restart", who=oplog.SUPERVISOR, profile=profile_id, why="stalled")

        def op(t: Ticket) -> None:
            if not self.boot.stop_and_release(f"restarting {profile_id}: the engine stalled"):
                self.admission.finish(t, False)
                return
            ok = self.boot.boot_profile(profile_id, build)
            if ok and stalled is not None:
                self.rec.apply(sm.Noted(f"restarted {profile_id} after a stall (previous run: {stalled.title})", stalled))
            self.admission.finish(t, ok)

        self.admission.submit("restart", profile_id, op)
