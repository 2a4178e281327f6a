"""The reconciler's pure step (docs/engine.md "One writer, events out"): `step(decided, fact) -> (decided, commands)`.

The workers — the observer reading Docker, the log follower, the liveness thread, the operation workers — only
post *facts* (what they saw or did) and carry out the *commands* that come back. Every rule that decides whether
a fact changes the engine's state is here, and reads only `Decided`: the snapshot plus what this process's
reconciler itself knows (the operation in flight, whether the observer serves that operation's Docker read,
whether this process adopted an engine before). No thread, no clock (the time is an input), no I/O: the table in
tests/engine/test_decider_step.py drives every rule. Anchors: a Kubernetes controller's reconcile from its cache
(informers observe, the loop decides, actuators act) and llama-swap's one goroutine that owns a process.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Union

from app.backend.contracts import LIVE_STATES, EngineSnapshot, EngineState
from app.backend.engine.decider import statemachine as sm

MUTATING = frozenset({"start", "stop", "switch", "restart"})  # "adopt" only watches: no lock, Docker's truth wins


@dataclass(frozen=True)
class Decided:
    """All a rule may read: the published snapshot and the reconciler's own few facts about this process."""

    snap: EngineSnapshot
    op: str = ""  # the action of this process's operation in flight ("" none; "adopt" is watch-only)
    op_id: int = 0  # its ticket (an end that comes after the next operation's begin ends nothing)
    syncing: bool = False  # the observer reads Docker for that operation (its SyncForOp): Docker's truth wins
    adopted_once: bool = False  # this process adopted an engine before (the first one is a "reattach")
    closed: bool = False

    @property
    def writing(self) -> bool:
        """This process runs a mutating operation: its own belief wins over Docker until it ends — except while
        the observer serves that operation's own read of Docker."""
        return self.op in MUTATING and not self.syncing


# -- facts: what a worker saw or did ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Put:
    """An operation's own event (its worker owns the run): applied as it is."""

    event: sm.Event


@dataclass(frozen=True)
class OpBegan:
    action: str
    ticket: int = 0


@dataclass(frozen=True)
class OpEnded:
    ticket: int = 0


@dataclass(frozen=True)
class SyncBegan:
    pass


@dataclass(frozen=True)
class SyncEnded:
    pass


@dataclass(frozen=True)
class Closing:
    pass


@dataclass(frozen=True)
class Judged:
    """A liveness verdict (stalled, moving again, a canary reading) on run `cid`, judged while it was `state`."""

    cid: str
    state: EngineState
    events: tuple[sm.Event, ...]


@dataclass(frozen=True)
class BootGated:
    """The boot gate's verdict on run `cid` (ready, or a progress note)."""

    cid: str
    event: sm.Event


@dataclass(frozen=True)
class BootLogMoved:
    """A followed log line moved run `cid`'s boot picture."""

    cid: str
    event: sm.Event


@dataclass(frozen=True)
class OutsideDrain:
    """Another process drains run `cid` (drainnote.py)."""

    cid: str
    event: sm.Draining


@dataclass(frozen=True)
class OutsideDrainEnded:
    event: sm.Draining


@dataclass(frozen=True)
class DockerAwayServing:
    """Docker does not answer, but run `cid` still does."""

    cid: str
    note: sm.Noted


@dataclass(frozen=True)
class DockerAway:
    """Docker does not answer and the engine does not either."""

    failed: sm.Failed


@dataclass(frozen=True)
class RunRemoved:
    """The failed run `cid`'s container is gone from Docker."""

    cid: str
    event: sm.Vanished


@dataclass(frozen=True)
class ExitSeen:
    """Run `cid` exited; `event` explains it (Failed or Vanished)."""

    cid: str
    event: sm.Event


@dataclass(frozen=True)
class RunningSeen:
    """A panel engine runs that this snapshot does not show: adopt it (`adopted.message` is the rule's to write)."""

    adopted: sm.Adopted
    n_running: int = 1


@dataclass(frozen=True)
class FilesSaid:
    """The supervision files (any process's wish, restarts, give-up) as the supervisor read them."""

    fields: sm.Supervised


@dataclass(frozen=True)
class SwitchEnded:
    result: str  # "ok", "rolled_back", "cancelled", anything else: failed


Fact = Union[Put, OpBegan, OpEnded, SyncBegan, SyncEnded, Closing, Judged, BootGated, BootLogMoved, OutsideDrain,
             OutsideDrainEnded, DockerAwayServing, DockerAway, RunRemoved, ExitSeen, RunningSeen, FilesSaid,
             SwitchEnded]


# -- commands: what the reconciler and the worker carry out ----------------------------------------------------
@dataclass(frozen=True)
class Publish:
    """Tell every listener: the snapshot moved from `before` to `after` by `kind` (events.py)."""

    kind: str
    before: EngineSnapshot
    after: EngineSnapshot


@dataclass(frozen=True)
class FollowAdopted:
    """The adoption was applied: follow its logs and say who started it (`first`: this panel's own, reattached)."""

    first: bool


Command = Union[Publish, FollowAdopted]


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
    return replace(d, adopted_once=True), events, [FollowAdopted(first)]


def _files_said(s: EngineSnapshot, fields: sm.Supervised) -> list[sm.Event]:
    if (s.desired, s.restart_policy, s.restarts_total, s.gave_up) == \
            (fields.desired, fields.restart_policy, fields.restarts_total, fields.gave_up):
        return []
    if fields.gave_up or not s.gave_up:
        return [fields]
    return [sm.Supervised(desired=fields.desired, restart_policy=fields.restart_policy,
                          restarts_total=fields.restarts_total, gave_up=False, restart_try=0)]


def _switch_counted(s: EngineSnapshot, result: str) -> sm.Supervised:
    if result == "ok":
        return sm.Supervised(switches_ok=s.switches_ok + 1)
    if result == "rolled_back":
        return sm.Supervised(switches_rolled_back=s.switches_rolled_back + 1)
    if result == "cancelled":
        return sm.Supervised(switches_cancelled=s.switches_cancelled + 1)
    return sm.Supervised(switches_failed=s.switches_failed + 1)


def rule(d: Decided, fact: Fact) -> tuple[Decided, list[sm.Event], list[Command]]:
    """The rule of one fact: the decider's new own facts, the events to apply (in order) and extra commands."""
    s = d.snap
    idle = d.op == ""
    match fact:
        case Put(event=ev):
            return d, [ev], []
        case OpBegan(action=action, ticket=ticket):
            return replace(d, op=action, op_id=ticket), [], []
        case OpEnded(ticket=ticket):
            return (replace(d, op="", op_id=0, syncing=False) if ticket == d.op_id else d), [], []
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
        case FilesSaid(fields=fields):
            return d, _files_said(s, fields), []
        case SwitchEnded(result=result):
            return d, [_switch_counted(s, result)], []
    raise TypeError(f"not a fact: {fact!r}")


def step(d: Decided, fact: Fact, now: float) -> tuple[Decided, list[Command]]:
    """One fact in, at wall time `now` (a changed state's `since`): the decider after it and the commands to carry
    out (a `Publish` per applied event, in order, then the rule's own). Pure: `sm.transition` raises
    IllegalTransition for an event no state allows."""
    d, events, extra = rule(d, fact)
    commands: list[Command] = []
    snap = d.snap
    for ev in events:
        after = sm.transition(snap, ev, now)
        commands.append(Publish(type(ev).__name__, snap, after))
        snap = after
    return replace(d, snap=snap), [*commands, *extra]
