"""The reconciler's pure step (docs/engine.md "One writer, events out"): `step(decided, fact, now) -> (decided,
commands)`; its vocabulary (the facts, the commands, `Decided`) is `facts.py`.

The workers — the observer reading Docker, the log follower, the liveness thread, the operation workers — only
post *facts* (what they saw or did) and carry out the *commands* that come back. Every rule that decides whether
a fact changes the engine's state is here, and reads only `Decided`: the snapshot plus what this process's
reconciler itself knows (the operation in flight, whether the observer serves that operation's Docker read,
whether this process adopted an engine before). No thread, no clock (the time is an input), no I/O: the table in
tests/engine/test_decider_step.py drives every rule. Anchors: a Kubernetes controller's reconcile from its cache
(informers observe, the loop decides, actuators act) and llama-swap's one goroutine that owns a process.
"""

from __future__ import annotations

from dataclasses import replace

from app.backend.contracts import LIVE_STATES, EngineSnapshot, EngineState
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.decider.facts import (BootGated, BootLogMoved, BootSeen, CancelAsked, ClearFailure, Closing,
                                              Command, CountRestart, Decided, DockerAway, DockerAwayServing, Due, EndOp,
                                              ExitSeen, Fact, FollowAdopted, Judged, MayStart, OpBegan, OpEnded,
                                              OutsideDrain, OutsideDrainEnded, Proceed, Publish, Put, RecordGiveUp,
                                              RespectStop, RestartNow, RestartRefused, RestartStalled, RollBack,
                                              RunRemoved, RunningSeen, StallRestart, SupervisionPass, SwitchAsked,
                                              SwitchDrained, SwitchEnded, SwitchFailed, SwitchFrom, SyncBegan,
                                              SyncEnded, WatchBoot, WishStopped)
from app.backend.engine.supervision.plan import BringBack, GiveUpNow, Respect, RestartLater, plan
from app.backend.engine.supervision.restartpolicy import GiveUp, Restart, decide




def _adopt(d: Decided, f: RunningSeen) -> tuple[Decided, list[sm.Event], list[Command]]:
    if d.writing or d.closed:
        return d, [], []
    s = d.snap
    first = s.state is EngineState.STOPPED and not s.container_id and not d.adopted_once
    a = f.adopted
    note = "reattached to the running engine" if first else f"adopted {a.container_name} (started outside this panel)"
    events: list[sm.Event] = [replace(a, message=note)]
    if f.n_running > 1:
        events.append(sm.Noted(f"adopted {a.container_name}; {f.n_running - 1} other panel engine(s) are also "
                               "running — stop them (never started twice by this panel)"))
    # still booting and no operation of this process gates it (one that adopts in its own read of Docker does)
    watch: list[Command] = [WatchBoot(a.container_id)] if not a.ready and d.op == "" else []
    return replace(d, adopted_once=True), events, [FollowAdopted(first), *watch]


def _cancelled(d: Decided, ticket: int) -> bool:
    """A stop cancelled operation `ticket` (CancelAsked): it ends at its next step."""
    return ticket != 0 and ticket == d.op_id and d.cancelled


def _may_start(d: Decided, f: MayStart) -> list[Command]:
    """A start boots only where no engine is live (a switch changes profile); a restart finds one the other
    process brought back first (never a second engine); a stop cancels either."""
    if _cancelled(d, f.ticket):
        return [EndOp(False, f"{f.action} cancelled by stop", "cancelled")]
    s = d.snap
    if s.state in LIVE_STATES and (f.ticket != 0 or d.op == ""):  # before admission: an operation in flight says why
        if f.action == "restart":
            return [EndOp(True, "already running", "ok")]
        return [EndOp(False, f"refused: an engine is already {s.state.value} (profile {s.profile_id}); "
                             "use switch to change profile", "refused")]
    return [Proceed()]


def _switch_asked(d: Decided, f: SwitchAsked) -> list[Command]:
    """Switch to what already serves: done; else go on, remembering what served before (the rollback target)."""
    if _cancelled(d, f.ticket):
        return [EndOp(False, f"switch to {f.profile_id} cancelled by stop", "cancelled")]
    s = d.snap
    same_build = not f.build or not s.build or s.build == f.build  # another build of the same profile is a switch
    if s.state is EngineState.READY and s.profile_id == f.profile_id and same_build:
        return [EndOp(True, f"already serving {f.profile_id}", "ok")]
    return [SwitchFrom(s.last_ready_profile, s.build or None)]


def _switch_failed(d: Decided, f: SwitchFailed) -> list[Command]:
    """Roll back to what served before, when asked and it is another profile; a stop's cancel wins."""
    if _cancelled(d, f.ticket):
        return [EndOp(False, f"switch to {f.profile_id} cancelled by stop", "cancelled")]
    to = f.rollback_to
    if f.auto_rollback and to is not None and to != f.profile_id and not d.closed:
        return [RollBack(to, f.build)]
    return []


def _files_said(s: EngineSnapshot, fields: sm.Supervised) -> list[sm.Event]:
    counts = (fields.switches_ok, fields.switches_failed, fields.switches_rolled_back, fields.switches_cancelled)
    if (s.desired, s.restart_policy, s.restarts_total, s.gave_up) == \
            (fields.desired, fields.restart_policy, fields.restarts_total, fields.gave_up) and \
            (None in counts or (s.switches_ok, s.switches_failed, s.switches_rolled_back, s.switches_cancelled) == counts):
        return []
    if fields.gave_up or not s.gave_up:
        return [fields]
    return [replace(fields, gave_up=False, restart_try=0)]


def _switch_counted(s: EngineSnapshot, result: str) -> sm.Supervised:
    if result == "ok":
        return sm.Supervised(switches_ok=s.switches_ok + 1)
    if result == "rolled_back":
        return sm.Supervised(switches_rolled_back=s.switches_rolled_back + 1)
    if result == "cancelled":
        return sm.Supervised(switches_cancelled=s.switches_cancelled + 1)
    return sm.Supervised(switches_failed=s.switches_failed + 1)


def _apply_all(snap: EngineSnapshot, events: list[sm.Event], now: float) -> EngineSnapshot:
    for ev in events:
        snap = sm.transition(snap, ev, now)
    return snap


def _supervise(d: Decided, f: SupervisionPass, now: float) -> tuple[Decided, list[sm.Event], list[Command]]:
    """What should run against what runs and what was tried -> at most one action (supervision/plan.py)."""
    events = _files_said(d.snap, f.files)
    snap = _apply_all(d.snap, events, now)
    cmds: list[Command] = []
    wish = f.wish
    if wish is not None and wish.since != d.wish_since:  # a new wish, from any process: its own count
        d = replace(d, wish_since=wish.since, restart_due=None, decided_for=None, env_tries=0)
    if snap.state is EngineState.READY:
        if f.failure_recorded:
            cmds.append(ClearFailure())
        d = replace(d, env_tries=0)
    if d.op:  # this process operates the engine: its operation decides
        return d, events, cmds
    if snap.state is EngineState.STOPPED and f.other_writer:
        # another process operates the engine (a CLI switch stops the old one before it boots the new): that stop
        # is its operation, not an outside stop to respect; decided once the lock is let go
        return d, events, cmds
    if wish is None or wish.kind == "stopped" or wish.profile_id is None:
        return replace(d, restart_due=None), events, cmds
    if snap.state is EngineState.READY and snap.restart_try:
        events.append(sm.Supervised(restart_try=0))
    if snap.state not in (EngineState.STOPPED, EngineState.FAILED) or snap.gave_up:
        return d, events, cmds
    if (due := d.restart_due) is not None:
        if now >= due.when:
            d = replace(d, restart_due=None)
            cmds.append(RestartNow(due.profile_id, due.why, due.capped))
        return d, events, cmds
    if d.decided_for == (snap.container_id, snap.since):
        return d, events, cmds
    d = replace(d, decided_for=(snap.container_id, snap.since))
    action = plan(snap, wish.profile_id, f.policy, list(f.recent), d.env_tries, now,
                  stopped_by_reboot=f.stopped_by_reboot)
    if isinstance(action, BringBack):
        d = replace(d, restart_due=Due(now, wish.profile_id, action.why, False))
    elif isinstance(action, Respect):
        cmds.append(RespectStop(wish.since, action.message))
    elif isinstance(action, GiveUpNow):
        events.append(sm.Supervised(gave_up=True, restart_try=0, message=action.message))
        cmds.append(RecordGiveUp(action.reason, action.why))
    elif isinstance(action, RestartLater):
        d = replace(d, env_tries=d.env_tries + (0 if action.capped else 1),
                    restart_due=Due(now + action.delay_s, wish.profile_id, action.why, action.capped))
        events.append(sm.Supervised(restart_try=action.try_no, message=action.message))
    return d, events, cmds


def _stall_restart(d: Decided, f: StallRestart, now: float) -> tuple[Decided, list[sm.Event], list[Command]]:
    """A stall restart counts against the policy's cap (restartpolicy.py): give up, or count it and restart."""
    verdict = decide(f.policy, "stalled", list(f.recent), now) if f.policy is not None else None
    if isinstance(verdict, GiveUp):
        return d, [sm.Supervised(gave_up=True, message=f"stalled — failed, {verdict.why}")], [
            RecordGiveUp("stalled", verdict.why)]
    counted: list[Command] = [CountRestart(verdict.try_no, verdict.of)] if isinstance(verdict, Restart) else []
    return d, [], [*counted, RestartStalled(f.profile_id)]


def rule(d: Decided, fact: Fact, now: float) -> tuple[Decided, list[sm.Event], list[Command]]:
    """The rule of one fact: the decider's new own facts, the events to apply (in order) and extra commands."""
    s = d.snap
    idle = d.op == ""
    match fact:
        case Put(event=ev):
            return d, [ev], []
        case OpBegan(action=action, ticket=ticket):
            return replace(d, op=action, op_id=ticket, cancelled=False), [], []
        case OpEnded(ticket=ticket):
            return (replace(d, op="", op_id=0, syncing=False, cancelled=False) if ticket == d.op_id else d), [], []
        case CancelAsked(ticket=ticket):
            return (replace(d, cancelled=True) if d.op and ticket == d.op_id else d), [], []
        case MayStart():
            return d, [], _may_start(d, fact)
        case SwitchAsked():
            return d, [], _switch_asked(d, fact)
        case SwitchDrained(ticket=ticket, profile_id=profile_id):
            end = EndOp(False, f"switch to {profile_id} cancelled by stop", "cancelled")
            return d, [], [end] if _cancelled(d, ticket) else [Proceed()]
        case BootSeen(cid=cid):  # booting, and nobody in this process waits for it
            idle_boot = idle and s.state is EngineState.STARTING and s.container_id == cid
            return d, [], [WatchBoot(cid)] if idle_boot else []
        case SyncBegan():
            return replace(d, syncing=True), [], []
        case SyncEnded():
            return replace(d, syncing=False), [], []
        case Closing():
            return replace(d, closed=True), [], []
        case Judged(cid=cid, state=state, events=events):
            return d, list(events) if idle and s.container_id == cid and s.state is state else [], []
        case BootGated(cid=cid, event=ev):  # a preflight before BootBegan counts as booting
            booting = s.state is EngineState.PREFLIGHT or (s.state is EngineState.STARTING and s.container_id == cid)
            return d, [ev] if booting else [], []
        case BootLogMoved(cid=cid, event=ev):
            return d, [ev] if s.state is EngineState.STARTING and s.container_id == cid else [], []
        case OutsideDrain(cid=cid, event=ev):
            return d, [ev] if idle and s.container_id == cid else [], []
        case OutsideDrainEnded(event=ev):
            return d, [ev] if idle and s.draining else [], []
        case DockerAwayServing(cid=cid, note=note):
            return d, [note] if not d.writing and s.container_id == cid and s.message != note.message else [], []
        case DockerAway(failed=failed):
            return d, [failed] if not d.writing and s.state in LIVE_STATES else [], []
        case RunRemoved(cid=cid, event=ev):
            return d, [ev] if not d.writing and s.state is EngineState.FAILED and s.container_id == cid else [], []
        case ExitSeen(cid=cid, event=ev):  # an operation started meanwhile, or the snapshot shows another run
            return d, [] if d.writing or (s.container_id and s.container_id != cid) else [ev], []
        case RunningSeen():
            return _adopt(d, fact)
        case SwitchEnded(result=result):
            return d, [_switch_counted(s, result)], []
        case SupervisionPass():
            return _supervise(d, fact, now)
        case StallRestart():
            return _stall_restart(d, fact, now)
        case SwitchFailed():
            return d, [], _switch_failed(d, fact)
        case RestartRefused():
            return replace(d, decided_for=None), [], []
        case WishStopped(since=since, key=key, message=message):
            return replace(d, wish_since=since), [sm.Supervised(desired=key, restart_try=0, message=message)], []
    raise TypeError(f"not a fact: {fact!r}")


def step(d: Decided, fact: Fact, now: float) -> tuple[Decided, list[Command]]:
    """One fact in, at wall time `now` (a changed state's `since`): the decider after it and the commands to carry
    out (a `Publish` per applied event, in order, then the rule's own). Pure: `sm.transition` raises
    IllegalTransition for an event no state allows."""
    d, events, extra = rule(d, fact, now)
    commands: list[Command] = []
    snap = d.snap
    for ev in events:
        after = sm.transition(snap, ev, now)
        commands.append(Publish(type(ev).__name__, snap, after))
        snap = after
    return replace(d, snap=snap), [*commands, *extra]
