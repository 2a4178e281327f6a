"""The drain before a stop or switch (docs/engine.md, "Keeps serving"): a stop or switch of a serving engine first
marks the snapshot `draining` (the gateway refuses new requests with 503 and a Retry-After of `expected_back_s`;
the Chat tab refuses to start an answer), waits until every registered `AnswerCounter` reports 0 or the grace
ends (`switch_now()` ends it at once), and only then stops the engine: an answer a client is reading is never
cut within the grace. The drain is said to the other processes on the data dir too (drainnote.py).
"""

from __future__ import annotations

import threading
import time

from app.backend import oplog
from app.backend.contracts import AnswerCounter, EngineState
from app.backend.engine.control.reconciler import Reconciler
from app.backend.engine.control.site import Site
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.errlog import ErrorsOnce
from app.backend.engine.lifecycle.drainnote import DrainNotes
from app.backend.engine.lifecycle.tickets import Ticket

DRAIN_POLL_S = 0.2
DRAIN_SETTLE_S = 0.1  # a gateway's status read and its count of answers are not one step: the drain waits this once


class Drain:
    """Owns what streams answers (the counters), "switch now", and a cancelled drain's deadline."""

    def __init__(self, site: Site, rec: Reconciler, drain_notes: DrainNotes, errors: ErrorsOnce, *,
                 cancel: threading.Event, closing: threading.Event) -> None:
        self.options, self.recipe = site.options, site.recipe
        self.rec = rec
        self.drain_notes = drain_notes
        self.errors = errors
        self._cancel, self._closing = cancel, closing  # a stop's cancel and close end a drain
        self._counters: list[AnswerCounter] = []  # what streams answers (gateway, Chat tab): a stop drains them
        self._now = threading.Event()  # switch_now()
        self._carry = 0.0  # the deadline of a drain a stop cancelled: that stop's own drain keeps it

    def add_counter(self, counter: AnswerCounter) -> None:
        self._counters.append(counter)

    def switch_now(self) -> None:
        """End the drain under way at once (the Engine tab's "Switch now"; close)."""
        self._now.set()

    def grace_s(self) -> float:
        """Seconds a stop/switch waits for the answers in flight: options, else the Service tab, else the recipe."""
        o = self.options
        if o.drain_grace_s is not None:
            return max(0.0, o.drain_grace_s)
        if o.drain_grace_fn is not None:
            try:
                v = o.drain_grace_fn()
            except (OSError, ValueError) as exc:  # an unreadable settings file: the recipe's value
                self.errors.caught("reading the drain grace setting", exc)
                v = None
            if v is not None:
                return max(0.0, float(v))
        return float(self.recipe.engine.drain_grace_s)

    def answers_in_flight(self) -> int:
        n = 0
        for c in list(self._counters):
            try:
                n += max(0, int(c.answers_in_flight()))
            except Exception as exc:  # a broken counter never blocks a stop: it counts as 0
                self.errors.caught("counting the answers in flight", exc, traceback=True)
        return n

    def _note(self, draining: bool, in_flight: int = 0, deadline: float = 0.0, expected_back_s: float = 0.0) -> None:
        """Tell the other processes on this data dir (a panel beside this CLI) that this engine drains, so their
        gateway and Chat tab start no new answer on it meanwhile (drainnote.py)."""
        try:
            self.drain_notes.publish(draining, in_flight, deadline, expected_back_s)
        except OSError as exc:  # a full disk: the drain goes on; the others then only see the engine go
            self.errors.caught("publishing the drain for other processes", exc)

    def end_note(self) -> None:
        """The drained engine stopped (or the operation ended): this process's drain note, if it still says
        draining, says it no longer does, and so does the snapshot (a stop that found no engine to stop)."""
        snap = self.rec.snapshot()
        if snap.draining:
            self.rec.apply(sm.Draining(False, 0, 0.0, snap.expected_back_s))
        try:
            self.drain_notes.end_own()
        except OSError as exc:  # a full disk: the note goes stale at its deadline anyway (drainnote.LATE_S)
            self.errors.caught("ending the drain note for other processes", exc)

    def drain(self, ticket: Ticket, who: str, *, expected_back_s: float) -> None:
        """Wait, draining, until no answer is in flight, the grace ends, `switch_now()`, or a stop cancels."""
        self._now.clear()
        snap = self.rec.snapshot()
        serving = snap.state in (EngineState.READY, EngineState.STALLED)
        n = self.answers_in_flight() if serving else 0
        grace = self.grace_s()
        if n == 0 and serving and grace > 0:
            # draining first, then counted again: a request the gateway admitted in the instant of the first
            # count (before it saw the drain) is then in flight and waited for, not cut (seen under a client
            # calling in a loop through a fleet's front, docs/fleet.md#the-fault-table)
            self.rec.apply(sm.Draining(True, 0, time.time() + grace, expected_back_s))
            self._now.wait(DRAIN_SETTLE_S)
            n = self.answers_in_flight()
        if n == 0 or grace <= 0:
            self._hold(serving, grace, expected_back_s)
            return
        deadline = time.time() + grace
        if self._carry > time.time():  # a stop that cancelled a switch's drain keeps its deadline
            deadline = min(deadline, self._carry)
        self._carry = 0.0
        self.rec.apply(sm.Draining(True, n, deadline, expected_back_s))
        self._note(True, n, deadline, expected_back_s)
        oplog.decision("engine", "drain", who=who, op=ticket.action, in_flight=n, grace_s=grace)
        try:
            while n > 0 and time.time() < deadline and not (self._now.is_set() or self._cancel.is_set()
                                                             or self._closing.is_set()):
                self._now.wait(DRAIN_POLL_S)
                m = self.answers_in_flight()
                if m != n:
                    n = m
                    self.rec.apply(sm.Draining(True, n, deadline, expected_back_s))
                    self._note(True, n, deadline, expected_back_s)
        finally:
            # otherwise kept until the engine has stopped (_end_drain_note): it stops next, and another process's
            # gateway must not start an answer on it in between (docs/gateway.md "One gateway")
            if self._cancel.is_set() or self._closing.is_set():
                self._note(False)
        ended = ("answers finished" if n == 0 else "switch now" if self._now.is_set() else
                 "cancelled" if self._cancel.is_set() or self._closing.is_set() else "grace ended")
        if ended == "cancelled":
            self._carry = deadline
        oplog.decision("engine", "drain_end", who=who, op=ticket.action, left=n, ended=ended)
        if ended == "cancelled":  # the stop that cancelled it drains on its own
            self.rec.apply(sm.Draining(False, 0, 0.0, expected_back_s))
        else:
            self._hold(serving, grace, expected_back_s)

    def _hold(self, serving: bool, grace: float, expected_back_s: float) -> None:
        """The drain is over, the stop comes next: the engine stays marked draining (no new answer, here or in
        another process's gateway) until the stop begins (statemachine: StopBegan clears it) or the operation
        ends (end_note). Cleared here, a request admitted in the 10-150 ms before the stop began was cut after
        its first tokens (docs/fleet.md "Faults", a box switching under a looping client)."""
        if not serving:
            self.rec.apply(sm.Draining(False, 0, 0.0, expected_back_s))  # the gateway's Retry-After for the boot
            return
        deadline = time.time() + max(grace, DRAIN_POLL_S)
        self.rec.apply(sm.Draining(True, 0, deadline, expected_back_s))
        self._note(True, 0, deadline, expected_back_s)
