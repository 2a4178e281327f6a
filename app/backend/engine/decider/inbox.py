"""The inboxes of the engine's two owner threads (docs/engine.md, "One writer, events out"): the reconciler's,
the ONE thread that writes engine state (Propose, Close), and the observer's, the one that reads Docker
(Kick, SyncForOp, Resync, Close).

llama-swap's shape (../shared/reference/style.md): one goroutine owns a process's state; everyone else
sends it requests. Here the operation workers, the log follower, the liveness/canary thread, the Docker
event pump and the callers of start/stop/switch put messages in one FIFO queue; the reconciler thread
takes them one at a time, so no two changes of the snapshot ever interleave.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Union

from app.backend.contracts import EngineSnapshot
from app.backend.engine.decider.facts import Command, Fact

@dataclass
class Reply:
    """The reconciler's answer to a message that waits: applied anything, the snapshot after, or the error."""

    done: threading.Event = field(default_factory=threading.Event)
    applied: bool = False
    snap: EngineSnapshot | None = None
    commands: list[Command] = field(default_factory=list)
    error: BaseException | None = None


@dataclass
class Propose:
    """A fact from a worker or an observer (the reconciler's pure step decides what it changes, decider/step.py).
    No reply: fire and forget (the log follower must never wait for the reconciler: it may be draining its
    streams)."""

    fact: Fact
    reply: Reply | None = None


@dataclass
class SyncForOp:
    """The operation in flight asks for Docker's truth before it acts (a start/switch acts on what runs)."""

    reply: Reply


@dataclass
class Resync:
    """`refresh()` and the constructor: re-read Docker now."""

    reply: Reply


@dataclass
class Kick:
    """Something changed outside (a Docker event, both log streams ended, an operation ended, a restart is
    due): reconcile with Docker and supervise. Coalesced: at most one waits in the queue."""


@dataclass
class Close:
    """The panel shuts down: the reconciler answers what is left and ends (the engine keeps running)."""


Message = Union[Propose, SyncForOp, Resync, Kick, Close]


class Inbox:
    """An unbounded FIFO (a put never blocks a sender) with coalesced kicks."""

    def __init__(self) -> None:
        self._q: queue.Queue[Message] = queue.Queue()
        self._kick_queued = threading.Event()

    def put(self, msg: Message) -> None:
        self._q.put(msg)

    def kick(self) -> None:
        if not self._kick_queued.is_set():
            self._kick_queued.set()
            self._q.put(Kick())

    def get(self, timeout: float | None) -> Message | None:
        """The next message, or None when `timeout` passed (time for the periodic resync)."""
        try:
            msg = self._q.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(msg, Kick):
            self._kick_queued.clear()  # a change after this point queues a new kick
        return msg

    def drain(self) -> list[Message]:
        out: list[Message] = []
        while True:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                return out
