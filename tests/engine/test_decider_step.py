"""The reconciler's pure step, rule by rule (issue 50 item 4; docs/engine.md "One writer, events out"): every fact
the workers post, in the states that take it and the ones that drop it. No thread, no clock, no I/O: the step is
a function of (decided, fact), and this table is its specification."""

from __future__ import annotations

import typing
from dataclasses import dataclass, replace

import pytest

from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.decider import facts as st
from app.backend.engine.decider.step import step
from app.backend.engine.supervision.restartpolicy import PolicyConfig

S = EngineState
NOW = 1_800_000_000.0
DIAG = Diagnosis("killed", "killed", "the engine was killed", "start it again")


def snap(state: EngineState = S.STOPPED, cid: str = "", **kw: object) -> EngineSnapshot:
    base = {"base_url": "http://127.0.0.1:8000", "profile_id": "quality"} if cid else {}
    return EngineSnapshot(state=state, container_id=cid, container_name=f"moet-{cid}" if cid else "", since=0.0,
                          **{**base, **kw})  # type: ignore[arg-type]


def decided(state: EngineState = S.STOPPED, cid: str = "", *, op: str = "", syncing: bool = False,
            adopted_once: bool = False, closed: bool = False, **kw: object) -> st.Decided:
    return st.Decided(snap(state, cid, **kw), op=op, syncing=syncing, adopted_once=adopted_once, closed=closed)


WISH = st.Wish("serve", "quality", 100.0)
SHOWN = {"desired": "serve:quality"}  # what the files say, already shown (no sync event)
SAID = sm.Supervised(desired="serve:quality", restart_policy="on-failure", restarts_total=0, gave_up=False)
OUTSIDE = Diagnosis("stopped_outside_panel", "stopped outside the panel", "SIGTERM", "start it again")


def sup(wish: st.Wish | None = WISH, files: sm.Supervised = SAID, *, recent: tuple[float, ...] = (),
        failure_recorded: bool = False, other_writer: bool = False) -> st.SupervisionPass:
    return st.SupervisionPass(wish, files, failure_recorded, recent, PolicyConfig(), False, other_writer)


def own(commands: list[st.Command]) -> list[st.Command]:
    """The commands for the poster (the reconciler publishes the rest)."""
    return [c for c in commands if not isinstance(c, st.Publish)]


def memory(d: st.Decided, **kw: object) -> st.Decided:
    return replace(d, **{"wish_since": WISH.since, **kw})  # type: ignore[arg-type]


ADOPTED = sm.Adopted("quality", "c1", "moet-c1", "http://127.0.0.1:8000", "model", False, True, "ready", None, "")
STALLED = sm.Stalled(DIAG, "stalled: 1 request(s) running, no token for 60 s")
FILES = sm.Supervised(desired="serve:quality", restart_policy="on-failure", restarts_total=2, gave_up=False)


@dataclass(frozen=True)
class Row:
    name: str
    before: st.Decided
    fact: st.Fact
    applied: tuple[type, ...] = ()  # the event kinds applied, in order ("" none)
    state: EngineState | None = None  # the snapshot's state after (None: unchanged)
    check: typing.Callable[[st.Decided, list[st.Command]], bool] = lambda d, c: True


ROWS = [
    # an operation's own events and the reconciler's own facts
    Row("put applies an operation's event as it is", decided(), st.Put(sm.PreflightBegan("quality")),
        (sm.PreflightBegan,), S.PREFLIGHT),
    Row("an operation begins", decided(S.READY, "c1"), st.OpBegan("switch", 7),
        check=lambda d, c: (d.op, d.op_id) == ("switch", 7) and d.writing),
    Row("a watch-only operation is not writing", decided(), st.OpBegan("adopt"), check=lambda d, c: not d.writing),
    Row("an operation ends (its sync too)", replace(decided(op="start", syncing=True), op_id=7), st.OpEnded(7),
        check=lambda d, c: d.op == "" and not d.syncing),
    Row("an end that comes after the next operation's begin", replace(decided(op="stop"), op_id=8), st.OpEnded(7),
        check=lambda d, c: (d.op, d.op_id) == ("stop", 8)),
    Row("a stop cancels the operation in flight", replace(decided(S.STARTING, "c1", op="start"), op_id=7),
        st.CancelAsked(7), check=lambda d, c: d.cancelled and c == []),
    Row("a cancel of an operation that already ended", replace(decided(op="stop"), op_id=8), st.CancelAsked(7),
        check=lambda d, c: not d.cancelled),
    Row("the next operation begins uncancelled", replace(decided(op="switch"), op_id=7, cancelled=True),
        st.OpBegan("stop", 8), check=lambda d, c: not d.cancelled),
    Row("an operation's end ends its cancel", replace(decided(op="switch"), op_id=7, cancelled=True), st.OpEnded(7),
        check=lambda d, c: not d.cancelled),
    # an operation's next step is the decider's word (its worker carries it out)
    Row("a start boots where nothing is live", replace(decided(op="start"), op_id=7), st.MayStart(7),
        check=lambda d, c: c == [st.Proceed()]),
    Row("a start finds an engine live", replace(decided(S.READY, "c1", op="start"), op_id=7), st.MayStart(7),
        check=lambda d, c: [type(x) for x in c] == [st.EndOp] and "already ready (profile quality)" in str(c)
        and "use switch" in str(c)),
    Row("a start asked before admission, an engine live", decided(S.STARTING, "c1"), st.MayStart(),
        check=lambda d, c: c[0] == st.EndOp(False, "refused: an engine is already starting (profile quality); "
                                                   "use switch to change profile", "refused")),
    Row("a start asked before admission while an operation runs: admission says why",
        replace(decided(S.READY, "c1", op="switch"), op_id=7), st.MayStart(), check=lambda d, c: c == [st.Proceed()]),
    Row("a start cancelled by a stop", replace(decided(op="start"), op_id=7, cancelled=True), st.MayStart(7),
        check=lambda d, c: c == [st.EndOp(False, "start cancelled by stop", "cancelled")]),
    Row("a restart finds the engine brought back", replace(decided(S.READY, "c1", op="restart"), op_id=7),
        st.MayStart(7, "restart"), check=lambda d, c: c == [st.EndOp(True, "already running", "ok")]),
    Row("a switch goes on, remembering what served", replace(decided(S.READY, "c1", op="switch", build="b1",
                                                                      last_ready_profile="quality"), op_id=7),
        st.SwitchAsked(7, "speed"), check=lambda d, c: c == [st.SwitchFrom("quality", "b1")]),
    Row("a switch to what already serves", replace(decided(S.READY, "c1", op="switch", build="b1"), op_id=7),
        st.SwitchAsked(7, "quality", "b1"), check=lambda d, c: c == [st.EndOp(True, "already serving quality", "ok")]),
    Row("a switch to another build of what serves", replace(decided(S.READY, "c1", op="switch", build="b1"), op_id=7),
        st.SwitchAsked(7, "quality", "b2"), check=lambda d, c: [type(x) for x in c] == [st.SwitchFrom]),
    Row("a switch cancelled before it drains", replace(decided(S.READY, "c1", op="switch"), op_id=7, cancelled=True),
        st.SwitchAsked(7, "speed"), check=lambda d, c: c == [st.EndOp(False, "switch to speed cancelled by stop",
                                                                     "cancelled")]),
    Row("a switch drained goes on", replace(decided(S.READY, "c1", op="switch"), op_id=7), st.SwitchDrained(7, "speed"),
        check=lambda d, c: c == [st.Proceed()]),
    Row("a stop during the switch's drain", replace(decided(S.READY, "c1", op="switch"), op_id=7, cancelled=True),
        st.SwitchDrained(7, "speed"), check=lambda d, c: c == [st.EndOp(False, "switch to speed cancelled by stop",
                                                                       "cancelled")]),
    # an engine booting that nobody in this process gates (the admission slot is the decider's `op`, not a field)
    Row("a boot nobody here gates is watched", decided(S.STARTING, "c1"), st.BootSeen("c1"),
        check=lambda d, c: c == [st.WatchBoot("c1")]),
    Row("a boot this process's operation gates", decided(S.STARTING, "c1", op="start"), st.BootSeen("c1"),
        check=lambda d, c: c == []),
    Row("a boot of a run no longer shown", decided(S.STARTING, "c2"), st.BootSeen("c1"), check=lambda d, c: c == []),
    Row("a run seen booting that is ready", decided(S.READY, "c1"), st.BootSeen("c1"), check=lambda d, c: c == []),
    Row("the observer serves the op's read of Docker", decided(op="start"), st.SyncBegan(),
        check=lambda d, c: d.syncing and not d.writing),
    Row("the read is over", decided(op="start", syncing=True), st.SyncEnded(), check=lambda d, c: d.writing),
    Row("closing", decided(), st.Closing(), check=lambda d, c: d.closed),
    # liveness: a verdict on the run it judged, while no operation runs
    Row("stalled: the judged run still serves", decided(S.READY, "c1"), st.Judged("c1", S.READY, (STALLED,)),
        (sm.Stalled,), S.STALLED),
    Row("stalled: an operation runs", decided(S.READY, "c1", op="switch"), st.Judged("c1", S.READY, (STALLED,))),
    Row("stalled: a watch-only op runs too", decided(S.READY, "c1", op="adopt"), st.Judged("c1", S.READY, (STALLED,))),
    Row("stalled: another run is shown", decided(S.READY, "c2"), st.Judged("c1", S.READY, (STALLED,))),
    Row("stalled: not ready any more", decided(S.STOPPING, "c1"), st.Judged("c1", S.READY, (STALLED,))),
    Row("moving again", decided(S.STALLED, "c1"), st.Judged("c1", S.STALLED, (sm.Unstalled("tokens move"),)),
        (sm.Unstalled,), S.READY),
    Row("a canary reading", decided(S.READY, "c1"), st.Judged("c1", S.READY, (sm.Supervised(canary="ok (0.04 s)"),)),
        (sm.Supervised,), check=lambda d, c: d.snap.canary == "ok (0.04 s)"),
    # the boot gate and the followed log
    Row("ready: the run boots", decided(S.STARTING, "c1"), st.BootGated("c1", sm.BecameReady("ready")),
        (sm.BecameReady,), S.READY),
    Row("ready: another run boots", decided(S.STARTING, "c2"), st.BootGated("c1", sm.BecameReady("ready"))),
    Row("a gate's note during preflight", decided(S.PREFLIGHT), st.BootGated("c1", sm.Noted("building…")),
        (sm.Noted,), S.PREFLIGHT),
    Row("ready: stopped meanwhile", decided(S.STOPPING, "c1"), st.BootGated("c1", sm.BecameReady("ready"))),
    Row("a boot phase from the log", decided(S.STARTING, "c1"), st.BootLogMoved("c1", sm.BootProgressed("weights 3/9")),
        (sm.BootProgressed,), check=lambda d, c: d.snap.phase == "weights 3/9"),
    Row("a boot phase after ready", decided(S.READY, "c1"), st.BootLogMoved("c1", sm.BootProgressed("late line"))),
    # another process's drain
    Row("an outside drain", decided(S.READY, "c1"), st.OutsideDrain("c1", sm.Draining(True, 2, 99.0)),
        (sm.Draining,), check=lambda d, c: d.snap.draining and d.snap.drain_in_flight == 2),
    Row("an outside drain while this process operates", decided(S.READY, "c1", op="stop"),
        st.OutsideDrain("c1", sm.Draining(True, 2, 99.0))),
    Row("an outside drain of another run", decided(S.READY, "c2"), st.OutsideDrain("c1", sm.Draining(True, 2, 99.0))),
    Row("the outside drain ends", decided(S.READY, "c1", draining=True), st.OutsideDrainEnded(sm.Draining(False)),
        (sm.Draining,), check=lambda d, c: not d.snap.draining),
    Row("no drain to end", decided(S.READY, "c1"), st.OutsideDrainEnded(sm.Draining(False))),
    Row("the drain is this process's own", decided(S.READY, "c1", op="stop", draining=True),
        st.OutsideDrainEnded(sm.Draining(False))),
    # Docker away
    Row("Docker away, the engine answers", decided(S.READY, "c1"), st.DockerAwayServing("c1", sm.Noted("Docker is away")),
        (sm.Noted,), S.READY, lambda d, c: d.snap.message == "Docker is away"),
    Row("Docker away: said once", decided(S.READY, "c1", message="Docker is away"),
        st.DockerAwayServing("c1", sm.Noted("Docker is away"))),
    Row("Docker away: this process writes", decided(S.READY, "c1", op="start"),
        st.DockerAwayServing("c1", sm.Noted("Docker is away"))),
    Row("Docker away: the op's own read counts", decided(S.READY, "c1", op="start", syncing=True),
        st.DockerAwayServing("c1", sm.Noted("Docker is away")), (sm.Noted,)),
    Row("Docker and the engine away", decided(S.READY, "c1"), st.DockerAway(sm.Failed(DIAG, "Docker away")),
        (sm.Failed,), S.FAILED),
    Row("Docker away, nothing runs", decided(), st.DockerAway(sm.Failed(DIAG, "Docker away"))),
    Row("Docker away during a start", decided(S.STARTING, "c1", op="start"), st.DockerAway(sm.Failed(DIAG, "x"))),
    Row("Docker away while watching an adopted boot", decided(S.STARTING, "c1", op="adopt"),
        st.DockerAway(sm.Failed(DIAG, "x")), (sm.Failed,), S.FAILED),
    # what Docker shows after a run
    Row("a failed run's container removed", decided(S.FAILED, "c1", diagnosis=DIAG),
        st.RunRemoved("c1", sm.Vanished("removed", DIAG)), (sm.Vanished,), S.STOPPED),
    Row("another failed run's container removed", decided(S.FAILED, "c2"), st.RunRemoved("c1", sm.Vanished("removed"))),
    Row("a removal while this process writes", decided(S.FAILED, "c1", op="start"), st.RunRemoved("c1", sm.Vanished("x"))),
    Row("an exit explained", decided(S.READY, "c1"), st.ExitSeen("c1", sm.Failed(DIAG, "engine exited")),
        (sm.Failed,), S.FAILED),
    Row("a fresh process explains the last exit", decided(), st.ExitSeen("c1", sm.Vanished("stopped outside")),
        (sm.Vanished,), S.STOPPED),
    Row("an exit of a run no longer shown", decided(S.READY, "c2"), st.ExitSeen("c1", sm.Failed(DIAG, "x"))),
    Row("an exit while this process switches", decided(S.STOPPING, "c1", op="switch"), st.ExitSeen("c1", sm.Failed(DIAG))),
    # adoption
    Row("the first engine found is reattached", decided(), st.RunningSeen(ADOPTED), (sm.Adopted,), S.READY,
        lambda d, c: d.adopted_once and st.FollowAdopted(True) in c and d.snap.message == "reattached to the running engine"),
    Row("a later one was started outside", decided(adopted_once=True), st.RunningSeen(ADOPTED), (sm.Adopted,), S.READY,
        lambda d, c: st.FollowAdopted(False) in c and "started outside this panel" in d.snap.message),
    Row("another run replaces the shown one", decided(S.FAILED, "c0"), st.RunningSeen(ADOPTED), (sm.Adopted,), S.READY,
        lambda d, c: st.FollowAdopted(False) in c),
    Row("several panel engines run", decided(), st.RunningSeen(ADOPTED, n_running=3), (sm.Adopted, sm.Noted), S.READY,
        lambda d, c: "2 other panel engine(s)" in d.snap.message),
    Row("an adopted engine still booting is watched", decided(), st.RunningSeen(replace(ADOPTED, ready=False)),
        (sm.Adopted,), S.STARTING, lambda d, c: c[-1] == st.WatchBoot("c1")),
    Row("adopted booting in an operation's own read: the operation gates it", decided(op="start", syncing=True),
        st.RunningSeen(replace(ADOPTED, ready=False)), (sm.Adopted,), S.STARTING,
        lambda d, c: not any(isinstance(x, st.WatchBoot) for x in c)),
    Row("no adoption while this process writes", decided(op="start"), st.RunningSeen(ADOPTED),
        check=lambda d, c: not d.adopted_once and c == []),
    Row("no adoption once closed", decided(closed=True), st.RunningSeen(ADOPTED), check=lambda d, c: c == []),
    # supervision files and switch counters
    Row("the files say something new", decided(), sup(None, FILES), (sm.Supervised,),
        check=lambda d, c: (d.snap.desired, d.snap.restarts_total) == ("serve:quality", 2)),
    Row("the files say what is shown", decided(desired="serve:quality", restarts_total=2), sup(None, FILES)),
    Row("a give-up cleared by the files restarts the count", decided(S.FAILED, "c1", gave_up=True, restart_try=3),
        sup(None, FILES), (sm.Supervised,), check=lambda d, c: not d.snap.gave_up and d.snap.restart_try == 0),
    Row("a give-up the files say", decided(S.FAILED, "c1"), sup(None, replace(FILES, gave_up=True)), (sm.Supervised,),
        check=lambda d, c: d.snap.gave_up),
    *[Row(f"a switch ends {result}", decided(S.READY, "c1", **{field: 4}), st.SwitchEnded(result), (sm.Supervised,),
          check=lambda d, c, field=field: getattr(d.snap, field) == 5)
      for result, field in (("ok", "switches_ok"), ("rolled_back", "switches_rolled_back"),
                            ("cancelled", "switches_cancelled"), ("failed", "switches_failed"))],
    # the supervisor: what should run, what runs, what was tried -> one action (supervision/plan.py)
    Row("bring back what should run", memory(decided(**SHOWN)), sup(),
        check=lambda d, c: d.restart_due is not None and d.restart_due.when == NOW and not d.restart_due.capped
        and d.decided_for == ("", 0.0)),
    Row("a due restart is made", memory(decided(**SHOWN), restart_due=st.Due(NOW - 1, "quality", "why", True)), sup(),
        check=lambda d, c: d.restart_due is None and c == [st.RestartNow("quality", "why", True)]),
    Row("a restart not yet due waits", memory(decided(**SHOWN), restart_due=st.Due(NOW + 5, "quality", "why", True)),
        sup(), check=lambda d, c: d.restart_due is not None and c == []),
    Row("a crash is restarted after the backoff", memory(decided(S.FAILED, "c1", diagnosis=DIAG, **SHOWN)), sup(),
        (sm.Supervised,), check=lambda d, c: d.snap.restart_try == 1 and "restarting, try 1 of 3" in d.snap.message
        and d.restart_due is not None and d.restart_due.when > NOW and d.restart_due.capped),
    Row("the cap reached: give up", memory(decided(S.FAILED, "c1", diagnosis=DIAG, **SHOWN)),
        sup(recent=(NOW - 30, NOW - 20, NOW - 10)), (sm.Supervised,),
        check=lambda d, c: d.snap.gave_up and own(c) == [st.RecordGiveUp("killed", "gave up after 3 tries in 15 min")]),
    Row("a failure already decided", memory(decided(S.FAILED, "c1", diagnosis=DIAG, **SHOWN), decided_for=("c1", 0.0)),
        sup(), check=lambda d, c: d.restart_due is None and c == []),
    Row("a person's outside stop is respected", memory(decided(diagnosis=OUTSIDE, **SHOWN)), sup(),
        check=lambda d, c: [type(x) for x in c] == [st.RespectStop] and "respected" in str(c)),
    Row("this process operates: its operation decides", memory(decided(op="start", **SHOWN)), sup(),
        check=lambda d, c: d.restart_due is None and c == []),
    Row("another process operates: its stop is no outside stop", memory(decided(**SHOWN)), sup(other_writer=True),
        check=lambda d, c: d.restart_due is None and c == []),
    Row("the wish is stopped: no restart stays due",
        memory(decided(**SHOWN), restart_due=st.Due(NOW - 1, "quality", "why", True)),
        sup(st.Wish("stopped", None, 100.0)), check=lambda d, c: d.restart_due is None and c == []),
    Row("a new wish starts its own count",
        replace(decided(S.READY, "c1", **SHOWN), wish_since=50.0, env_tries=2, decided_for=("c0", 1.0)), sup(),
        check=lambda d, c: (d.wish_since, d.env_tries, d.decided_for) == (WISH.since, 0, None)),
    Row("serving again clears the failure and the try", memory(decided(S.READY, "c1", restart_try=2, **SHOWN)),
        sup(failure_recorded=True), (sm.Supervised,),
        check=lambda d, c: d.snap.restart_try == 0 and own(c) == [st.ClearFailure()]),
    Row("what the files say is shown first", memory(decided(S.READY, "c1")), sup(), (sm.Supervised,),
        check=lambda d, c: d.snap.desired == "serve:quality"),
    Row("given up: waits for a person", memory(decided(S.FAILED, "c1", diagnosis=DIAG, gave_up=True, **SHOWN)),
        sup(files=replace(SAID, gave_up=True)), check=lambda d, c: d.restart_due is None and c == []),
    Row("a refused restart is decided again", memory(decided(), decided_for=("c1", 5.0)), st.RestartRefused(),
        check=lambda d, c: d.decided_for is None),
    Row("the supervisor wrote a person's stop as the wish", decided(S.STOPPED, **SHOWN),
        st.WishStopped(200.0, "stopped", "stopped outside the panel — respected"), (sm.Supervised,),
        check=lambda d, c: d.wish_since == 200.0 and d.snap.desired == "stopped"),
    # a stall restart counts against the policy's cap
    Row("a stall restart within the cap", decided(S.STALLED, "c1"),
        st.StallRestart("quality", (NOW - 30,), PolicyConfig()),
        check=lambda d, c: own(c) == [st.CountRestart(2, 3), st.RestartStalled("quality")]),
    Row("a stall restart past the cap gives up", decided(S.STALLED, "c1"),
        st.StallRestart("quality", (NOW - 30, NOW - 20, NOW - 10), PolicyConfig()), (sm.Supervised,),
        check=lambda d, c: d.snap.gave_up and [type(x) for x in own(c)] == [st.RecordGiveUp]),
    Row("an unsupervised controller restarts a stall uncounted", decided(S.STALLED, "c1"),
        st.StallRestart("quality", (), None), check=lambda d, c: own(c) == [st.RestartStalled("quality")]),
    # a failed switch rolls back to what served before, when asked
    Row("a failed switch rolls back", decided(S.FAILED, "c1"), st.SwitchFailed("speed", "quality", "b1", True),
        check=lambda d, c: own(c) == [st.RollBack("quality", "b1")]),
    Row("no rollback when not asked", decided(S.FAILED, "c1"), st.SwitchFailed("speed", "quality", None, False),
        check=lambda d, c: own(c) == []),
    Row("no rollback when nothing served before", decided(S.FAILED, "c1"), st.SwitchFailed("speed", None, None, True),
        check=lambda d, c: own(c) == []),
    Row("no rollback to the profile that failed", decided(S.FAILED, "c1"), st.SwitchFailed("speed", "speed", None, True),
        check=lambda d, c: own(c) == []),
    Row("a failed switch a stop cancelled: no rollback", replace(decided(S.FAILED, "c1", op="switch"), op_id=7,
                                                                cancelled=True),
        st.SwitchFailed("speed", "quality", None, True, 7),
        check=lambda d, c: own(c) == [st.EndOp(False, "switch to speed cancelled by stop", "cancelled")]),
    Row("no rollback while closing", decided(S.FAILED, "c1", closed=True), st.SwitchFailed("speed", "quality", None, True),
        check=lambda d, c: own(c) == []),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_step_applies_each_rule(row: Row) -> None:
    after, commands = step(row.before, row.fact, NOW)
    published = [c for c in commands if isinstance(c, st.Publish)]
    assert tuple(c.kind for c in published) == tuple(t.__name__ for t in row.applied)
    assert after.snap.state is (row.state or row.before.snap.state)
    assert after.snap.since in (row.before.snap.since, NOW)  # the time comes in with the fact
    if published:  # each change is published from the state before it to the one after, in order
        assert published[0].before == row.before.snap and published[-1].after == after.snap
        assert all(a.after == b.before for a, b in zip(published, published[1:], strict=False))
    else:
        assert after.snap == row.before.snap
    assert row.check(after, commands), (after, commands)
    assert step(row.before, row.fact, NOW) == (after, commands)  # a function: the same fact, the same answer


def test_every_fact_has_its_rule_in_the_table() -> None:
    assert {type(r.fact) for r in ROWS} == set(typing.get_args(st.Fact))


def test_an_event_no_state_allows_is_refused_not_applied() -> None:
    with pytest.raises(sm.IllegalTransition):
        step(decided(), st.Put(sm.BecameReady("ready")), NOW)
