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

import logging
import threading
import time

from app.backend import oplog
from app.backend.contracts import EngineSnapshot
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.control.core import Core
from app.backend.engine.decider.inbox import Close, Propose, Reply
from app.backend.engine.decider.facts import Command, Fact, Publish, Put
from app.backend.engine.decider.step import step

HEARTBEAT_S = 1.0  # the loop's longest idle wait: heartbeat() is never older than this on a healthy panel
ASK_DEADLINE_S = 10.0  # an ask the reconciler does not answer within this is an error (it does no I/O)


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


class Reconciler(Core):
    def heartbeat(self) -> float:
        """time.monotonic() of the reconciler loop's last turn (it turns at least every HEARTBEAT_S)."""
        return self._beat

    def _reconciler_loop(self) -> None:
        """Take proposals one at a time and apply them: the only thread that calls `_write`."""
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

    def _on_reconciler(self) -> bool:
        return threading.current_thread() is self._reconciler

    def _post(self, fact: Fact, *, wait: bool = True) -> Reply:
        """A fact for the reconciler: its step runs there. The reply holds what it applied, the snapshot after and
        the commands for the poster. On the reconciler itself: applied at once. Raises ReconcilerTimeout past
        ASK_DEADLINE_S; after close: answered with no change."""
        reply = Reply()
        if self._on_reconciler():
            reply.commands = self._step(fact)
            reply.applied = any(isinstance(c, Publish) for c in reply.commands)
            reply.snap = self._snap
            return reply
        if not wait:
            self._inbox.put(Propose(fact))
            reply.snap = self._snap
            return reply
        self._inbox.put(Propose(fact, reply))
        if not wait_reply(reply, self._reconciler, ASK_DEADLINE_S, "the engine reconciler"):
            reply.applied, reply.commands = False, []
        reply.snap = reply.snap or self._snap
        return reply

    def _propose(self, fact: Fact, *, wait: bool = True) -> tuple[bool, EngineSnapshot]:
        """(anything applied, the snapshot after) for `fact` (see `_post`)."""
        reply = self._post(fact, wait=wait)
        return reply.applied, reply.snap or self._snap

    def _apply(self, event: sm.Event) -> EngineSnapshot:
        """An operation's own event, applied unconditionally; returns the snapshot after it."""
        return self._propose(Put(event))[1]

    def _writing(self) -> bool:
        """This process runs a mutating operation (the decider's word: step.Decided.writing). A watch-only op
        (gating an adopted engine) does not count: the reconcile keeps following Docker."""
        return self._decided.writing

    def _step(self, fact: Fact) -> list[Command]:
        """Run the pure step and carry out its publishing; the other commands go back to the poster."""
        if not self._on_reconciler():
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

    def _caught(self, context: str, exc: BaseException, *, traceback: bool = False, level: int = logging.WARNING) -> None:
        """oplog.caught once per distinct error of a context (errlog.py): a poll that fails the same way every
        second writes one line."""
        self._errors.caught(context, exc, traceback=traceback, level=level)

    def _recovered(self, context: str) -> bool:
        """The context works again; True when it had failed (the caller may log the recovery once)."""
        return self._errors.recovered(context)
