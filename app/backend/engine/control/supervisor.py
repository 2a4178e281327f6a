"""The supervisor's hands (docs/engine.md, "Keeps serving"): on the observer thread after each pass over Docker,
it reads what should run (desired.py), what was tried (history.py) and two facts of the host, posts them to the
decider as one fact (`SupervisionPass`; the decision is the pure step's, supervision/plan.py) and carries out
the commands that come back: restart, record a give-up, respect a person's outside stop, clear a healed failure.
The stall restart (`_restart_stalled`, on the liveness thread) asks the step the same way (`StallRestart`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime, timezone

from app.backend import oplog
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.decider.facts import (ClearFailure, Command, CountRestart, EndOp, MayStart, RecordGiveUp,
                                              RespectStop, RestartNow, RestartRefused, RestartStalled, StallRestart,
                                              SupervisionPass, Wish, WishStopped)
from app.backend.engine.control.core import Core
from app.backend.engine.supervision.desired import Desired
from app.backend.engine.supervision.history import Supervision
from app.backend.engine.lifecycle.tickets import Ticket
from app.backend.engine.supervision.restartpolicy import PolicyConfig
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

class Supervisor(Core):

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

    def _supervision_fields(self, desired: Desired | None) -> sm.Supervised:
        """The snapshot's supervision fields as the files say (any process's wish, restart, give-up or switch)."""
        hist = self.history.read()
        return replace(switch_counts(hist), desired=desired.key if desired else "",
                       restart_policy=self.restart_policy(), restarts_total=hist.restarts_total,
                       gave_up=hist.gave_up_on(desired) is not None)

    def _supervise(self) -> None:
        """After each pass over Docker, on the observer thread: read the files and the host, post them to the
        decider (`SupervisionPass`: its pure step decides, supervision/plan.py) and carry out its commands."""
        if not self.options.supervise or self._closed:
            return
        with self._wish_lock:  # read and decided together: a click's wish in between is never overwritten
            desired = self.desired_store.read()
            hist = self.history.read()
            fact = SupervisionPass(
                wish=Wish(desired.kind, desired.profile_id, desired.since) if desired is not None else None,
                files=self._supervision_fields(desired), failure_recorded=hist.gave_up is not None,
                recent=tuple(hist.recent(desired)), policy=self._policy_config(),
                stopped_by_reboot=self.stopped_by_reboot(self._last_exit),
                other_writer=self.oplock.holder() is not None)
            commands = self._post(fact).commands
        for c in commands:
            self._carry_out(c, desired)

    def _carry_out(self, c: Command, desired: Desired | None) -> None:
        """The supervisor's commands: the writes and the operation the decider asked for."""
        if isinstance(c, ClearFailure):
            self.history.clear_failure()
        elif isinstance(c, RestartNow):
            self._supervised_restart(c.profile_id, c.why, capped=c.capped)
        elif isinstance(c, RespectStop):
            with self._wish_lock:
                now_wish = self.desired_store.read()
                if now_wish is None or now_wish.since != c.wish_since:
                    return  # a person's wish came meanwhile: it wins over the outside stop
                d = self.desired_store.write("stopped", None, "supervisor (stopped outside the panel)")
                self._propose(WishStopped(d.since, d.key, c.message))
            oplog.decision("engine", "outside_stop_respected", who=oplog.OUTSIDE, desired=d.key)
        elif isinstance(c, RecordGiveUp) and desired is not None:
            self.history.give_up(desired, c.reason, c.why)
            oplog.decision("engine", "give_up", who=oplog.SUPERVISOR, level=30, profile=desired.profile_id,
                           reason=c.reason, why=c.why)

    def _supervised_restart(self, profile_id: str, why: str, *, capped: bool) -> None:
        def op(t: Ticket) -> None:
            self._reconcile_now()
            if isinstance(verdict := self._ask(MayStart(t.id, "restart")), EndOp):  # another panel brought it back
                t.ok, t.message = verdict.ok, verdict.message  # first (never a second engine), or a stop cancelled it
                return
            hist = self.history.restarted(time.time(), capped=capped)
            self._apply(sm.Supervised(restarts_total=hist.restarts_total, message=why))
            wish = self.desired_store.read()  # the build asked for comes back, not the current one
            build = wish.build if wish is not None and wish.profile_id == profile_id else None
            oplog.decision("engine", "restart", who=oplog.SUPERVISOR, profile=profile_id, build=build, why=why)
            self._finish(t, self._boot_profile(profile_id, build))

        t = self._submit("restart", profile_id, op)
        if not t.accepted:  # the lock is held by another writer: decide again on the next pass
            self._propose(RestartRefused())

    def _restart_stalled(self, profile_id: str) -> None:
        """restart_on_stall (on the liveness thread): the policy's verdict is the step's (`StallRestart`); this
        carries out its commands. Same profile and build; the stalled run's log files stay on disk, its
        diagnosis stays shown."""
        stalled = self.snapshot().diagnosis
        build = self.snapshot().build or None  # the stalled run's build comes back
        desired = self.desired_store.read() if self.options.supervise else None
        recent = tuple(self.history.read().recent(desired)) if self.options.supervise else ()
        fact = StallRestart(profile_id, recent, self._policy_config() if self.options.supervise else None)
        restart = False
        for c in self._post(fact).commands:
            if isinstance(c, RecordGiveUp):
                if desired is not None:
                    self.history.give_up(desired, c.reason, c.why)
                oplog.decision("engine", "give_up", who=oplog.SUPERVISOR, level=30, profile=profile_id,
                               reason=c.reason, why=c.why)
            elif isinstance(c, CountRestart):  # the policy's cap counts stall restarts too
                hist = self.history.restarted(time.time(), capped=True)
                self._apply(sm.Supervised(restarts_total=hist.restarts_total, restart_try=c.try_no,
                                          message=f"stalled — restarting, try {c.try_no} of {c.of}"))
            elif isinstance(c, RestartStalled):
                restart = True
        if not restart:
            return
        oplog.decision("engine", "restart", who=oplog.SUPERVISOR, profile=profile_id, why="stalled")

        def op(t: Ticket) -> None:
            if not self._stop_and_release(f"restarting {profile_id}: the engine stalled"):
                self._finish(t, False)
                return
            ok = self._boot_profile(profile_id, build)
            if ok and stalled is not None:
                self._apply(sm.Noted(f"restarted {profile_id} after a stall (previous run: {stalled.title})", stalled))
            self._finish(t, ok)

        self._submit("restart", profile_id, op)
