"""The one writer of engine state (docs/engine.md, "One writer, events out"): the reconciler thread.

It takes messages one at a time from its inbox — facts from the operation workers, the observer, the log
follower and the liveness thread — runs the pure step (`decider/step.py`: the rules, `transition()`) on each
against the decider's state of that moment, and carries out its commands: publish each change, hand the rest
back to the worker that posted the fact. It makes no I/O at all (no Docker, no HTTP,
no files), so an ask is answered in microseconds and a click never waits behind a Docker call; every ask has
a deadline all the same (`ASK_DEADLINE_S`). The loop turns at least every `HEARTBEAT_S` even when idle:
`heartbeat()` is what the systemd watchdog reads (a wedged reconciler gets the panel restarted).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from app.backend import oplog
from app.backend.contracts import EngineSnapshot
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.decider.events import EventBus, SnapshotWatch
from app.backend.engine.decider.inbox import Close, Inbox, Propose, Reply
from app.backend.engine.decider.facts import Closing, Command, Decided, Fact, Publish, Put
from app.backend.engine.decider.step import step

HEARTBEAT_S = 1.0  # the loop's longest idle wait: heartbeat() is never older than this on a healthy panel
ASK_DEADLINE_S = 10.0  # an ask the reconciler does not answer within this is an error (it does no I/O)


def join_thread(t: threading.Thread, timeout: float) -> None:
    """Join a part's thread on close: never the caller's own (close() from a change callback), never one that
    did not start (a controller without the watch)."""
    if t is not threading.current_thread() and t.ident is not None:
        t.join(timeout=timeout)


class ReconcilerTimeout(RuntimeError):
    """The reconciler did not answer an ask within its deadline (wedged): the asker fails instead of hanging."""


def wait_reply(reply: Reply, server: threading.Thread, deadline_s: float, who: str) -> bool:
    """Wait for `server`'s answer: True when answered (its error re-raised here), False when the server ended
    (closed: no change), ReconcilerTimeout past the deadline."""
    deadline = time.monotonic() + deadline_s
    while not reply.done.wait(0.5):
        if not server.is_alive():
            return False
        if time.monotonic() > deadline:
            raise ReconcilerTimeout(f"{who} did not answer within {deadline_s:.0f} s")
    if reply.error is not None:
        raise reply.error
    return True


class Reconciler:
    """The one writer: owns the decider's state (`Decided`, its snapshot), its inbox and its thread."""

    def __init__(self, decided: Decided, events: EventBus) -> None:
        self.events = events
        self._decided = decided  # all a rule reads (decider/step.py): written on the reconciler thread only
        self._snap = decided.snap  # `_decided.snap`, published with it (a reader takes one reference)
        self._lock = threading.RLock()  # a write and its publishing; a watch starts under it (no change between)
        self._changed = threading.Condition(self._lock)
        self._inbox = Inbox()  # facts (Propose) and Close
        self._beat = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="engine-reconciler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """No adoption after this; the loop answers what is left unchanged and ends (the engine keeps running)."""
        self._inbox.put(Propose(Closing()))
        self._inbox.put(Close())

    def join(self, timeout: float) -> None:
        join_thread(self._thread, timeout)

    @property
    def decided(self) -> Decided:
        """The decider's state now (immutable): for a worker's timing (the supervisor's restart due, an operation
        in flight), never to decide a change itself."""
        return self._decided

    def snapshot(self) -> EngineSnapshot:
        """The snapshot the reconciler last wrote: an immutable object, read without a lock (one reference)."""
        return self._snap

    def heartbeat(self) -> float:
        """time.monotonic() of the reconciler loop's last turn (it turns at least every HEARTBEAT_S)."""
        return self._beat

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

    def watch(self, on_change: Callable[[], None] | None) -> SnapshotWatch:
        """A watch made under the lock `_step` publishes under: no change falls between the snapshot it starts
        from and the first event it gets."""
        with self._lock:
            return self.events.watch(self._snap, on_change)

    def _loop(self) -> None:
        """Take facts one at a time and run the step on each: the only thread that writes the decider's state."""
        while True:
            msg = self._inbox.get(HEARTBEAT_S)
            self._beat = time.monotonic()
            if isinstance(msg, Close):
                break
            if isinstance(msg, Propose):
                self._handle(msg)
        for left in self._inbox.drain():  # closed: nothing changes any more; release whoever waits
            if isinstance(left, Propose) and left.reply is not None:
                left.reply.snap = self._snap
                left.reply.done.set()

    def _handle(self, msg: Propose) -> None:
        """Serve one fact; a rule's error goes back to its sender (or, fire-and-forget, to the log)."""
        reply = msg.reply
        try:
            commands = self._step(msg.fact)
            if reply is not None:
                reply.commands = commands
                reply.applied = any(isinstance(c, Publish) for c in commands)
        except Exception as exc:  # the reconciler must survive anything
            if reply is not None:
                reply.error = exc
            else:
                oplog.caught("engine", exc, "applying a fire-and-forget fact", traceback=True)
        finally:
            if reply is not None:
                reply.snap = self._snap
                reply.done.set()

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def post(self, fact: Fact, *, wait: bool = True) -> Reply:
        """A fact for the reconciler: its step runs there. The reply holds what it applied, the snapshot after and
        the commands for the poster. On the reconciler itself: applied at once. Raises ReconcilerTimeout past
        ASK_DEADLINE_S; after close: answered with no change."""
        reply = Reply()
        if self.on_thread():
            reply.commands = self._step(fact)
            reply.applied = any(isinstance(c, Publish) for c in reply.commands)
            reply.snap = self._snap
            return reply
        if not wait:
            self._inbox.put(Propose(fact))
            reply.snap = self._snap
            return reply
        self._inbox.put(Propose(fact, reply))
        if not wait_reply(reply, self._thread, ASK_DEADLINE_S, "the engine reconciler"):
            reply.applied, reply.commands = False, []
        reply.snap = reply.snap or self._snap
        return reply

    def propose(self, fact: Fact, *, wait: bool = True) -> tuple[bool, EngineSnapshot]:
        """(anything applied, the snapshot after) for `fact` (see `post`)."""
        reply = self.post(fact, wait=wait)
        return reply.applied, reply.snap or self._snap

    def apply(self, event: sm.Event) -> EngineSnapshot:
        """An operation's own event, applied unconditionally; returns the snapshot after it."""
        return self.propose(Put(event))[1]

    def writing(self) -> bool:
        """This process runs a mutating operation (the decider's word: Decided.writing). A watch-only op
        (gating an adopted engine) does not count: the reconcile keeps following Docker."""
        return self._decided.writing

    def _step(self, fact: Fact) -> list[Command]:
        """Run the pure step and carry out its publishing; the other commands go back to the poster."""
        if not self.on_thread():
            raise RuntimeError("engine state is written by the reconciler thread only (docs/engine.md)")
        with self._lock:
            decided, commands = step(self._decided, fact, time.time())
            self._decided = decided
            self._snap = decided.snap
            published = [c for c in commands if isinstance(c, Publish)]
            if published:
                self._changed.notify_all()
            for c in published:  # never blocks: each listener has its own queue (events.py)
                self.events.publish(c.kind, c.before, c.after)
            return commands
