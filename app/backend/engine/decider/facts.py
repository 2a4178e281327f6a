"""The decider's vocabulary (docs/engine.md "One writer, events out"): the facts the workers post, the commands
the step hands back, and the decider's own state (`Decided`: all a rule may read). The rules are `step.py`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.supervision.restartpolicy import PolicyConfig

MUTATING = frozenset({"start", "stop", "switch", "restart"})  # "adopt" only watches: no lock, Docker's truth wins


@dataclass(frozen=True)
class Due:
    """A restart the supervisor scheduled: at `when` (wall time), of `profile_id`, `why`; `capped`: it counts
    against the policy's cap (a cause of the box around the engine does not)."""

    when: float
    profile_id: str
    why: str
    capped: bool


@dataclass(frozen=True)
class Decided:
    """All a rule may read: the published snapshot and the reconciler's own few facts about this process."""

    snap: EngineSnapshot
    op: str = ""  # the action of this process's operation in flight ("" none; "adopt" is watch-only)
    op_id: int = 0  # its ticket (an end that comes after the next operation's begin ends nothing)
    syncing: bool = False  # the observer reads Docker for that operation (its SyncForOp): Docker's truth wins
    adopted_once: bool = False  # this process adopted an engine before (the first one is a "reattach")
    closed: bool = False
    # the supervisor's memory (docs/engine.md "Keeps serving"): the wish it decided for, the restart it scheduled,
    # the failure it already decided on (container, since), the tries in a row of a cause of the box around it
    wish_since: float = 0.0
    restart_due: Due | None = None
    decided_for: tuple[str, float] | None = None
    env_tries: int = 0
    cancelled: bool = False  # a stop cancelled the operation in flight (`CancelAsked`): its worker ends it

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
class CancelAsked:
    """A stop cancels operation `ticket` (posted by the caller of stop() before it wakes that operation's waits,
    so any fact the woken worker posts next is decided as cancelled)."""

    ticket: int


@dataclass(frozen=True)
class MayStart:
    """A start (`action` "start") or the supervisor's restart ("restart"), after its read of Docker: may it boot?
    `ticket` 0: the caller of start(), before admission."""

    ticket: int = 0
    action: str = "start"


@dataclass(frozen=True)
class SwitchAsked:
    """The switch worker, after its read of Docker: switch to `profile_id` on `build` ("": whichever build)."""

    ticket: int
    profile_id: str
    build: str = ""


@dataclass(frozen=True)
class SwitchDrained:
    """The switch's drain ended: go on to stop the old engine and boot `profile_id`?"""

    ticket: int
    profile_id: str


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
class BootSeen:
    """Run `cid` runs and the snapshot shows it booting: gate it, unless an operation of this process does."""

    cid: str


@dataclass(frozen=True)
class RunningSeen:
    """A panel engine runs that this snapshot does not show: adopt it (`adopted.message` is the rule's to write)."""

    adopted: sm.Adopted
    n_running: int = 1


@dataclass(frozen=True)
class SwitchEnded:
    result: str  # "ok", "rolled_back", "cancelled", anything else: failed


@dataclass(frozen=True)
class Wish:
    """The desired state as the supervisor read it (desired.py)."""

    kind: str  # "serve" | "stopped"
    profile_id: str | None
    since: float


@dataclass(frozen=True)
class SupervisionPass:
    """The supervisor's read of the files and the host after a pass over Docker: the wish, what the files say
    (shown first when they differ), the restart history for this wish, the policy, and two facts of the box."""

    wish: Wish | None
    files: sm.Supervised  # the supervision fields as the files say (shown first, when they differ)
    failure_recorded: bool  # the history holds a give-up (cleared once the engine serves again)
    recent: tuple[float, ...]  # the capped restarts made for this wish
    policy: PolicyConfig
    stopped_by_reboot: bool  # the last exited run ended with the host
    other_writer: bool  # another process holds the engine lock (its stop is its operation, not an outside stop)


@dataclass(frozen=True)
class StallRestart:
    """The liveness thread judged the run stalled and restarts on a stall: the policy's verdict is the step's.
    `policy` None: this controller does not supervise (the CLI's), so no cap applies."""

    profile_id: str
    recent: tuple[float, ...]  # the capped restarts made for the wish
    policy: PolicyConfig | None


@dataclass(frozen=True)
class SwitchFailed:
    """The new profile of a switch did not come up: roll back to what served before (`rollback_to`, its build),
    if the options allow it (`auto_rollback`) and it is another profile."""

    profile_id: str
    rollback_to: str | None
    build: str | None
    auto_rollback: bool
    ticket: int = 0  # the switch's: a stop that cancelled it wins over the rollback


@dataclass(frozen=True)
class RestartRefused:
    """The scheduled restart was refused (another writer holds the lock): decide again on the next pass."""


@dataclass(frozen=True)
class WishStopped:
    """The supervisor wrote "stopped" for a person's outside stop (its wish now)."""

    since: float
    key: str
    message: str


Fact = Union[Put, OpBegan, OpEnded, CancelAsked, MayStart, SwitchAsked, SwitchDrained, BootSeen, SyncBegan, SyncEnded,
             Closing, Judged, BootGated, BootLogMoved, OutsideDrain, OutsideDrainEnded, DockerAwayServing, DockerAway,
             RunRemoved, ExitSeen, RunningSeen, SwitchEnded, SupervisionPass, StallRestart, SwitchFailed, RestartRefused, WishStopped]


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


@dataclass(frozen=True)
class ClearFailure:
    """The engine serves again: clear the give-up in the history (history.py)."""


@dataclass(frozen=True)
class RestartNow:
    """Restart `profile_id` now, as the supervisor's operation (it may be refused: `RestartRefused`)."""

    profile_id: str
    why: str
    capped: bool


@dataclass(frozen=True)
class RespectStop:
    """A person stopped the engine outside the panel: write "stopped" as the wish, unless a wish newer than
    `wish_since` came meanwhile (then `WishStopped` is not posted and the person's wish wins)."""

    wish_since: float
    message: str


@dataclass(frozen=True)
class CountRestart:
    """Count the stall restart in the history (it counts against the cap), then show try `try_no` of `of`."""

    try_no: int
    of: int


@dataclass(frozen=True)
class RestartStalled:
    """Stop the stalled run and boot `profile_id` again (the liveness thread's restart operation)."""

    profile_id: str


@dataclass(frozen=True)
class RollBack:
    """Stop the failed switch's run and boot `profile_id` (at `build`) again."""

    profile_id: str
    build: str | None


@dataclass(frozen=True)
class RecordGiveUp:
    """The policy gave up: record it in the history, with the cause (the snapshot already says it)."""

    reason: str
    why: str


@dataclass(frozen=True)
class Proceed:
    """The operation goes on to its next step."""


@dataclass(frozen=True)
class EndOp:
    """The operation ends here, with `ok` and `message` for its ticket; `result`: the switch counters' label (ok,
    cancelled, failed) or "refused"."""

    ok: bool
    message: str
    result: str


@dataclass(frozen=True)
class SwitchFrom:
    """The switch goes on; what served before it is its rollback target (`profile_id` on `build`)."""

    profile_id: str | None
    build: str | None


@dataclass(frozen=True)
class WatchBoot:
    """Gate run `cid`'s boot in a watch-only operation (an engine booting that no operation of this process
    waits for: adopted, or started by another process)."""

    cid: str


Command = Union[Publish, FollowAdopted, Proceed, EndOp, SwitchFrom, WatchBoot, ClearFailure, RestartNow, RespectStop,
                RecordGiveUp, CountRestart, RestartStalled, RollBack]
