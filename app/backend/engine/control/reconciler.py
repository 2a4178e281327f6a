"""The one writer of engine state (docs/engine.md, "One writer, events out"): the reconciler thread.

It takes messages one at a time from its inbox — proposals from the operation workers, the observer, the log
follower and the liveness thread — evaluates each rule against the snapshot of that moment, applies the
events through `statemachine.transition()` and publishes them. It makes no I/O at all (no Docker, no HTTP,
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
from app.backend.engine.control.core import MUTATING, Core
from app.backend.engine.decider.inbox import Close, Decide, Propose, Reply

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
        """Serve one proposal; a rule's error goes back to its sender (or, fire-and-forget, to the log)."""
        reply = msg.reply
        try:
            applied, _ = self._decide_and_write(msg.decide)
            if reply is not None:
                reply.applied = applied
        except Exception as exc:  # the reconciler must survive anything
            if reply is not None:
                reply.error = exc
            else:
                oplog.caught("engine", exc, "applying a fire-and-forget proposal", traceback=True)
        finally:
            if reply is not None:
                reply.snap = self._snap
                reply.done.set()

    def _on_reconciler(self) -> bool:
        return threading.current_thread() is self._reconciler

    def _propose(self, decide: Decide, *, wait: bool = True) -> tuple[bool, EngineSnapshot]:
        """A change for the reconciler: `decide(snapshot)` runs there and returns the events to apply.
        Returns (anything applied, the snapshot after). On the reconciler itself: applied at once.
        Raises ReconcilerTimeout past ASK_DEADLINE_S; after close: answered with no change."""
        if self._on_reconciler():
            return self._decide_and_write(decide)
        if not wait:
            self._inbox.put(Propose(decide))
            return False, self._snap
        reply = Reply()
        self._inbox.put(Propose(decide, reply))
        if not wait_reply(reply, self._reconciler, ASK_DEADLINE_S, "the engine reconciler"):
            return False, self._snap
        return reply.applied, reply.snap or self._snap

    def _apply(self, event: sm.Event) -> EngineSnapshot:
        """Propose one event unconditionally; returns the snapshot after it."""
        return self._propose(lambda _: [event])[1]

    def _writing(self) -> bool:
        """This process runs a mutating operation: its own belief wins over Docker until it ends — except while
        the observer serves that operation's SyncForOp (it asked for Docker's truth). A watch-only op (gating
        an adopted engine) does not count: the reconcile keeps following Docker."""
        busy = self._busy
        return busy is not None and busy.action in MUTATING and not self._syncing_for_op

    def _decide_and_write(self, decide: Decide) -> tuple[bool, EngineSnapshot]:
        # under the op-admission lock: a rule that reads `_busy` is atomic with `_submit` setting it
        with self._lock:
            events = list(decide(self._snap))
            for ev in events:
                self._write(ev)
            return bool(events), self._snap

    def _write(self, event: sm.Event) -> EngineSnapshot:
        """The one place the snapshot changes: transition, wake waiters, publish the change (never blocks)."""
        if not self._on_reconciler():
            raise RuntimeError("engine state is written by the reconciler thread only (docs/engine.md)")
        with self._lock:
            before = self._snap
            self._snap = sm.transition(before, event)
            self._changed.notify_all()
            self.events.publish(type(event).__name__, before, self._snap)
            return self._snap

    def _caught(self, context: str, exc: BaseException, *, traceback: bool = False, level: int = logging.WARNING) -> None:
        """oplog.caught once per distinct error of a context (errlog.py): a poll that fails the same way every
        second writes one line."""
        self._errors.caught(context, exc, traceback=traceback, level=level)

    def _recovered(self, context: str) -> bool:
        """The context works again; True when it had failed (the caller may log the recovery once)."""
        return self._errors.recovered(context)
