"""Admission (docs/engine.md "One writer"): one operation at a time in this process, the cross-process engine lock
for a mutating one, tickets, and the worker thread that carries an operation out. The decider learns of the
admitted operation by `OpBegan` and of its end by `OpEnded`, in the inbox's order; no rule reads the slot."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Callable

from app.backend import oplog
from app.backend.contracts import Diagnosis
from app.backend.engine.control.reconciler import Reconciler, ReconcilerTimeout
from app.backend.engine.control.site import Site
from app.backend.engine.decider.facts import MUTATING, CancelAsked, Command, EndOp, Fact, OpBegan, OpEnded, Publish
from app.backend.engine.errlog import ErrorsOnce
from app.backend.engine.lifecycle.oplock import EngineLock, LockHeld
from app.backend.engine.lifecycle.tickets import Ticket
from app.backend.engine.runtime.base import RuntimeUnavailable

Work = Callable[[Ticket], None]


def ask(rec: Reconciler, fact: Fact) -> Command:
    """The decider's word on an operation's next step (decider/step.py): `Proceed`, `SwitchFrom`, `RollBack` or
    `EndOp`. Closed meanwhile (no answer): the operation ends."""
    for c in rec.post(fact).commands:
        if not isinstance(c, Publish):
            return c
    return EndOp(False, "refused: the panel is shutting down", "refused")


class Admission:
    """Owns the slot (which operation runs), the ticket numbers and the operations' listeners."""

    def __init__(self, site: Site, rec: Reconciler, oplock: EngineLock, errors: ErrorsOnce, *,
                 cancel: threading.Event, wake: threading.Event, closing: threading.Event,
                 fail: Callable[[Diagnosis, str], None], end_drain: Callable[[], None],
                 kick: Callable[[], None]) -> None:
        self.options = site.options
        self._site = site
        self.rec = rec
        self.oplock = oplock
        self.errors = errors
        self._cancel, self._wake, self._closing = cancel, wake, closing
        self._fail = fail  # boot's: a failed operation leaves FAILED with its diagnosis
        self._end_drain = end_drain  # an operation that ended another way (an error) leaves no drain said
        self._kick = kick  # the observer re-reads Docker once this process's belief no longer wins
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._busy: Ticket | None = None  # the admitted operation (rules read the decider's `op`, not this)
        self._ids = itertools.count(1)
        self._listeners: list[Callable[[Ticket], None]] = []  # told of every finished operation (/metrics counts)

    def busy(self) -> Ticket | None:
        with self._lock:
            return self._busy

    def add_listener(self, cb: Callable[[Ticket], None]) -> None:
        self._listeners.append(cb)

    def refused(self, action: str, profile_id: str | None, message: str) -> Ticket:
        t = Ticket(next(self._ids), action, profile_id, False, message, ok=False)
        t._done.set()
        return t

    def cancel_for_stop(self, then_stop: Callable[[Ticket, Ticket, bool], None]) -> Ticket | str | None:
        """A stop while another operation runs cancels it: the stop's ticket, handed to `then_stop(busy, ticket,
        have_lock)` (which waits for the cancelled one); a refusal's message; None when idle or a stop runs."""
        with self._lock:
            busy = self._busy
            if busy is None or busy.action == "stop":
                return None
            have_lock = False
            if busy.action not in MUTATING:  # only watching (adopt): the engine may be another writer's
                try:
                    self.oplock.acquire(self.options.actor, "stop")
                    have_lock = True
                except (LockHeld, OSError) as exc:  # OSError: a full disk cannot take the lock's note
                    return str(exc)
            # the decider hears of the cancel before the operation's waits wake: what that worker posts next is
            # decided as cancelled (decider/step.py); the events only wake its waits
            self.rec.propose(CancelAsked(busy.id), wait=False)
            self._cancel.set()
            self._wake.set()
            ticket = Ticket(next(self._ids), "stop", None, True, f"cancelling the {busy.action}, then stopping")
            then_stop(busy, ticket, have_lock)
            return ticket

    def admit_when_idle(self, ticket: Ticket) -> None:
        """Wait until no operation runs, then admit `ticket` (a stop after the operation it cancelled)."""
        with self._lock:
            while self._busy is not None:  # another op slipped in; wait for it too
                self._changed.wait(0.5)
            self._admit(ticket)

    def _admit(self, ticket: Ticket) -> None:
        """Under `_lock`: `ticket` is this process's operation. The decider learns it by a fact, in the inbox's
        order: a fact posted before is decided as before the operation, one after as during it."""
        self._busy = ticket
        self.rec.propose(OpBegan(ticket.action, ticket.id), wait=False)

    def release(self, ticket: Ticket) -> None:
        """The operation ended: admission opens, and the decider has learnt it before this returns (the observer
        kicked next reads Docker as no longer overruled). Not under `_lock`: the reconciler takes it."""
        with self._lock:
            self._busy = None
            self._changed.notify_all()
        try:
            self.rec.propose(OpEnded(ticket.id))  # a later operation's OpBegan may come first: the decider keeps it
        except ReconcilerTimeout as exc:  # a wedged reconciler: the watchdog restarts the panel (docs/engine.md)
            self.errors.caught("telling the reconciler an operation ended", exc)

    def submit(self, action: str, profile_id: str | None, fn: Work) -> Ticket:
        with self._lock:
            if self._closing.is_set():
                return self.refused(action, profile_id, "refused: the panel is shutting down")
            if self._busy is not None:
                b = self._busy
                if action in MUTATING and b.action not in MUTATING and (holder := self.oplock.holder()) is not None:
                    return self.refused(action, profile_id, str(LockHeld(holder)))  # the writer whose boot we watch
                what = f"{b.action} to {b.profile_id}" if b.profile_id else b.action
                return self.refused(action, profile_id, f"refused: a {what} is already in progress — wait for it to finish")
            if action in MUTATING:
                try:
                    self.oplock.acquire(self.options.actor, action, profile_id or "")
                except LockHeld as exc:
                    return self.refused(action, profile_id, str(exc))
                except OSError as exc:
                    return self.refused(action, profile_id, f"refused: cannot take the engine lock {self.oplock.path} "
                                                            f"({exc.strerror or exc}); is the data dir writable?")
            ticket = Ticket(next(self._ids), action, profile_id, True, f"{action} accepted")
            self._admit(ticket)
        threading.Thread(target=self.run, args=(ticket, fn), name=f"engine-{action}", daemon=True).start()
        return ticket

    def run(self, ticket: Ticket, fn: Work) -> None:
        """Carry out an admitted operation on this thread; whatever happens, it ends (lock, slot, ticket)."""
        if ticket.action == "stop":
            self._cancel.clear()
            self._wake.clear()
        try:
            fn(ticket)
        except Exception as exc:  # a bug or a vanished daemon: surface it, never leave the op hanging
            d = self._site.runtime_failure(exc)
            self._fail(d, f"{ticket.action} failed: {exc}")
            ticket.ok, ticket.diagnosis, ticket.message = False, d, f"{ticket.action} failed: {exc}"
            oplog.caught("engine", exc, f"the {ticket.action} operation", traceback=not isinstance(exc, RuntimeUnavailable))
        finally:
            ticket.finished = time.time()
            self._end_drain()
            if ticket.action in MUTATING:
                self.oplock.release()
            self.release(ticket)
            self._kick()
            ticket._done.set()
            for cb in list(self._listeners):
                try:
                    cb(ticket)
                except Exception as exc:  # a listener (the /metrics counters) never breaks an operation
                    self.errors.caught("an operation listener", exc, traceback=True)

    def finish(self, ticket: Ticket, ok: bool) -> None:
        """A boot's outcome on its ticket, and the operator's log line of when and how it ended (issue 49)."""
        snap = self.rec.snapshot()
        ticket.ok = ok
        ticket.diagnosis = None if ok else snap.diagnosis
        ticket.message = (f"{snap.profile_id} ready" if ok else
                          f"{ticket.action} failed: {snap.diagnosis.title if snap.diagnosis else snap.message}")
        oplog.decision("engine", "ready" if ok else f"{ticket.action}_failed", who=self.options.actor.lower(),
                       profile=snap.profile_id if ok else ticket.profile_id, gpu=self.options.gpu,
                       after_s=round(time.time() - ticket.started, 1), why=None if ok else ticket.message)
