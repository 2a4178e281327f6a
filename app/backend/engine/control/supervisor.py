"""The supervisor (docs/engine.md, "Keeps serving"): what should run (the desired state, desired.py) against
what runs (the snapshot) and what was tried (history.py) -> one action.

`plan()` is a pure function of those facts; `Supervisor._supervise` (on the observer thread, after each pass
over Docker) reads the files, calls it and acts through operations: bring back, restart with backoff, give up
(a non-healing cause, or the cap), or respect a person's outside stop. Causes of the box around the engine
(Docker away, GPU memory not yet released, a busy port) are retried while they last and never give up; a clean
stop the Docker daemon made (seen after an outage) is brought back like a reboot's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone

from app.backend import oplog
from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.decider.step import FilesSaid
from app.backend.engine.control.core import Core
from app.backend.engine.supervision.desired import Desired
from app.backend.engine.logs.exits import NEUTRAL_REASONS
from app.backend.engine.lifecycle.tickets import Ticket
from app.backend.engine.supervision.restartpolicy import ENVIRONMENT, GiveUp, PolicyConfig, Restart, decide
from app.backend.engine.runtime.base import Instance


@dataclass(frozen=True)
class BringBack:
    why: str  # nothing runs though it should (reboot, a daemon restart, never started): at once, not capped


@dataclass(frozen=True)
class RestartLater:
    delay_s: float
    why: str  # the log's and the snapshot's message for the restart itself
    message: str  # shown now ("… — restarting, try 1 of 3 in 5 s")
    try_no: int
    capped: bool  # counts against the cap (an ENVIRONMENT cause does not)


@dataclass(frozen=True)
class Respect:
    message: str  # a clean outside stop while the host and Docker were up: a person's stop


@dataclass(frozen=True)
class GiveUpNow:
    reason: str
    why: str
    message: str


Action = BringBack | RestartLater | Respect | GiveUpNow | None


def plan(snap: EngineSnapshot, profile_id: str, cfg: PolicyConfig, recent: list[float], env_tries: int,
         now: float, *, stopped_by_reboot: bool) -> Action:
    """What to do about a STOPPED/FAILED engine that should serve `profile_id` (pure).

    `recent`: the times of the capped restarts made for this wish; `env_tries`: tries in a row of an ENVIRONMENT
    cause."""
    d = snap.diagnosis
    reason = d.reason if d else ""
    if snap.state is EngineState.STOPPED and not snap.container_id and not reason:
        return BringBack(f"bringing back {profile_id} (it should run; nothing runs)")
    if stopped_by_reboot:
        return BringBack(f"bringing back {profile_id} (stopped by the host's reboot)")
    if reason == "docker_restarted":
        return BringBack(f"bringing back {profile_id} (stopped while Docker was unreachable)")
    if snap.state is EngineState.STOPPED:
        if reason in NEUTRAL_REASONS:
            return Respect(f"{snap.message or 'stopped outside the panel'} — respected: desired state is now stopped")
        return None
    title = d.title if d else snap.message
    verdict = decide(cfg, reason, recent, now, env_tries)
    if isinstance(verdict, GiveUp):
        return GiveUpNow(reason, verdict.why, f"{title} — failed, {verdict.why}")
    if isinstance(verdict, Restart):
        env = reason in ENVIRONMENT
        of = "" if env else f" of {verdict.of}"
        when = f" in {verdict.delay_s:.0f} s" if verdict.delay_s >= 1 else ""
        heals = f" (retried while {ENVIRONMENT[reason]})" if env else ""
        return RestartLater(verdict.delay_s, f"restarting {profile_id} after: {title} (try {verdict.try_no}{of})",
                            f"{title} — restarting, try {verdict.try_no}{of}{when}{heals}", verdict.try_no, not env)
    return None


def iso_ts(text: str) -> float | None:
    """Docker's RFC 3339 time (nanoseconds, 'Z') as a Unix time; None when empty or Docker's zero time."""
    if not text or text.startswith("0001"):
        return None
    try:
        return datetime.strptime(text[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return None


class Supervisor(Core):
    _wish_since: float

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
        """The snapshot's supervision fields as the files say (any process's wish, restart or give-up)."""
        hist = self.history.read()
        return sm.Supervised(desired=desired.key if desired else "", restart_policy=self.restart_policy(),
                             restarts_total=hist.restarts_total, gave_up=hist.gave_up_on(desired) is not None)

    def _sync_supervision(self, desired: Desired | None) -> EngineSnapshot:
        """Publish what the files say (a wish, restart or give-up of any process); the snapshot after."""
        return self._propose(FilesSaid(self._supervision_fields(desired)))[1]

    def _supervise(self) -> None:
        """Compare the desired state with the snapshot and act. On the observer thread, after each pass."""
        if not self.options.supervise or self._closed:
            return
        with self._wish_lock:  # read and published together: a click's wish in between is never overwritten
            desired = self.desired_store.read()
            snap = self._sync_supervision(desired)
        if desired is not None and desired.since != self._wish_since:  # a new wish, from any process
            self._wish_since = desired.since
            self._restart_due, self._decided_for, self._env_tries = None, None, 0
        if snap.state is EngineState.READY:
            if self.history.read().gave_up is not None:
                self.history.clear_failure()
            self._env_tries = 0
        if self._busy is not None:
            return
        if snap.state is EngineState.STOPPED and self.oplock.holder() is not None:
            # another process operates the engine (a CLI switch stops the old one before it boots the new): that
            # stop is its operation, not an outside stop to respect; decided once the lock is let go
            return
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
                self._supervised_restart(due[1], due[2], capped=due[3])
            return
        if self._decided_for == (snap.container_id, snap.since):
            return
        self._decided_for = (snap.container_id, snap.since)
        self._act(snap, desired, now)

    def _act(self, snap: EngineSnapshot, desired: Desired, now: float) -> None:
        assert desired.profile_id is not None
        recent = self.history.read().recent(desired)
        action = plan(snap, desired.profile_id, self._policy_config(), recent, self._env_tries, now,
                      stopped_by_reboot=self.stopped_by_reboot(self._last_exit))
        if isinstance(action, BringBack):
            self._schedule(now, desired.profile_id, action.why, capped=False)
        elif isinstance(action, Respect):
            with self._wish_lock:
                now_wish = self.desired_store.read()
                if now_wish is None or now_wish.since != desired.since:
                    return  # a person's wish came meanwhile: it wins over the outside stop
                d = self.desired_store.write("stopped", None, "supervisor (stopped outside the panel)")
                self._wish_since = d.since
                self._apply(sm.Supervised(desired=d.key, restart_try=0, message=action.message))
            oplog.decision("engine", "outside_stop_respected", who=oplog.OUTSIDE, desired=d.key)
        elif isinstance(action, GiveUpNow):
            self.history.give_up(desired, action.reason, action.why)
            self._apply(sm.Supervised(gave_up=True, restart_try=0, message=action.message))
            oplog.decision("engine", "give_up", who=oplog.SUPERVISOR, level=30, profile=desired.profile_id,
                           reason=action.reason, why=action.why)
        elif isinstance(action, RestartLater):
            if not action.capped:
                self._env_tries += 1
            self._apply(sm.Supervised(restart_try=action.try_no, message=action.message))
            self._schedule(now + action.delay_s, desired.profile_id, action.why, capped=action.capped)

    def _schedule(self, when: float, profile_id: str, why: str, *, capped: bool) -> None:
        self._restart_due = (when, profile_id, why, capped)  # the observer's next wait ends at `when`

    def _supervised_restart(self, profile_id: str, why: str, *, capped: bool) -> None:
        def op(t: Ticket) -> None:
            self._reconcile_now()
            if self._already_live():  # another panel brought it back first: never a second engine
                t.ok, t.message = True, "already running"
                return
            hist = self.history.restarted(time.time(), capped=capped)
            self._apply(sm.Supervised(restarts_total=hist.restarts_total, message=why))
            wish = self.desired_store.read()  # the build asked for comes back, not the current one
            build = wish.build if wish is not None and wish.profile_id == profile_id else None
            oplog.decision("engine", "restart", who=oplog.SUPERVISOR, profile=profile_id, build=build, why=why)
            self._finish(t, self._boot_profile(profile_id, build))

        t = self._submit("restart", profile_id, op)
        if not t.accepted:  # the lock is held by another writer: decide again on the next pass
            self._decided_for = None

    def _restart_stalled(self, profile_id: str) -> None:
        """restart_on_stall: same profile; the stalled run's log files stay on disk, its diagnosis stays shown."""
        stalled = self.snapshot().diagnosis
        build = self.snapshot().build or None  # the stalled run's build comes back
        if self.options.supervise:  # the policy's cap counts stall restarts too
            desired = self.desired_store.read()
            verdict = decide(self._policy_config(), "stalled", self.history.read().recent(desired), time.time())
            if isinstance(verdict, GiveUp):
                if desired is not None:
                    self.history.give_up(desired, "stalled", verdict.why)
                self._apply(sm.Supervised(gave_up=True, message=f"stalled — failed, {verdict.why}"))
                oplog.decision("engine", "give_up", who=oplog.SUPERVISOR, level=30, profile=profile_id,
                               reason="stalled", why=verdict.why)
                return
            if isinstance(verdict, Restart):
                hist = self.history.restarted(time.time(), capped=True)
                self._apply(sm.Supervised(restarts_total=hist.restarts_total, restart_try=verdict.try_no,
                                          message=f"stalled — restarting, try {verdict.try_no} of {verdict.of}"))
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
