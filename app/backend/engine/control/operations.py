"""Operations, each on its own worker thread (docs/engine.md, "Start, stop, switch"): admission (one at a time,
the cross-process engine lock), tickets, the desired state a person's start/stop/switch records, the drain
before a stop or switch, and the switch with its rollback.

Drain (docs/engine.md, "Keeps serving"): a stop or switch of a serving engine first marks the snapshot
`draining` (the gateway refuses new requests with 503 and a Retry-After of `expected_back_s`; the Chat tab
refuses to start an answer), waits until every registered `AnswerCounter` reports 0 or the grace ends
(`switch_now()` ends it at once), and only then stops the engine: an answer a client is reading is never cut
within the grace.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from app.backend import oplog
from app.backend.contracts import Diagnosis, EngineState
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.runtime.base import BUILD_LABEL
from app.backend.engine.control.core import MUTATING
from app.backend.engine.decider.facts import (Command, EndOp, Fact, MayStart, OpBegan, OpEnded, Proceed, Publish, RollBack,
                                              SwitchAsked, SwitchDrained, SwitchEnded, SwitchFailed, SwitchFrom)
from app.backend.engine.supervision.desired import DesiredKind
from app.backend.engine.lifecycle.tickets import Ticket
from app.backend.engine.lifecycle.oplock import LockHeld
from app.backend.engine.control.reconciler import ReconcilerTimeout
from app.backend.engine.runtime.base import RuntimeUnavailable
from app.backend.engine.control.supervisor import Supervisor
from app.backend.recipe.command import RunSpec

DRAIN_POLL_S = 0.2
DRAIN_SETTLE_S = 0.1  # a gateway's status read and its count of answers are not one step: the drain waits this once


class Operations(Supervisor):
    def _intent(self, ticket: Ticket, kind: DesiredKind, profile_id: str | None, who: str,
                build: str | None = None) -> Ticket:
        """An accepted start/stop/switch is the user's intent: persist it (a refused one changes nothing) and log
        the decision with who asked. A new wish clears a give-up and restarts the cap (history.py), for every
        process on the data dir: the supervisor derives both from the wish's time."""
        oplog.decision("engine", ticket.action, who=who, profile=profile_id, gpu=self.options.gpu,
                       accepted=ticket.accepted, note=None if ticket.accepted else ticket.message)
        if ticket.accepted:
            with self._wish_lock:  # the supervisor never publishes what it read of the files before this wish
                d = self.desired_store.write(kind, profile_id, self.options.actor, build)
                try:
                    self._apply(sm.Supervised(desired=d.key, gave_up=False, restart_try=0))
                except ReconcilerTimeout as exc:  # the operation runs regardless; the supervisor re-reads the file
                    self._caught("recording the desired state", exc)
        return ticket

    def _stop_after(self, busy: Ticket, ticket: Ticket, who: str, have_lock: bool = False) -> None:
        busy.wait()
        with self._lock:
            while self._busy is not None:  # another op slipped in; wait for it too
                self._changed.wait(0.5)
            self._admit(ticket)
        try:
            if not have_lock:
                self.oplock.acquire(self.options.actor, "stop")
        except (LockHeld, OSError) as exc:  # another process took over meanwhile, or a full disk took the note
            ticket.ok, ticket.message = False, str(exc)
            self._release(ticket)
            ticket._done.set()
            return
        self._run_op(ticket, lambda t: self._op_stop(t, who))

    def _spec_for(self, action: str, profile_id: str, build: str | None = None) -> RunSpec | Ticket:
        """The operation's one spec (one profile and build lookup), or its refusal naming the operation."""
        try:
            return self.run_spec(profile_id, build=build)
        except (KeyError, ValueError) as exc:
            return self._refused(action, profile_id, f"refused: {exc.args[0] if exc.args else exc}")

    def _ask(self, fact: Fact) -> Command:
        """The decider's word on an operation's next step (decider/step.py): `Proceed`, `SwitchFrom` or `EndOp`.
        Closed meanwhile (no answer): the operation ends."""
        for c in self._post(fact).commands:
            if not isinstance(c, Publish):
                return c
        return EndOp(False, "refused: the panel is shutting down", "refused")

    def _refused(self, action: str, profile_id: str | None, message: str) -> Ticket:
        t = Ticket(next(self._ids), action, profile_id, False, message, ok=False)
        t._done.set()
        return t

    def _admit(self, ticket: Ticket) -> None:
        """Under `_lock`: `ticket` is this process's operation. The decider learns it by a fact, in the inbox's
        order: a fact posted before is decided as before the operation, one after as during it."""
        self._busy = ticket
        self._propose(OpBegan(ticket.action, ticket.id), wait=False)

    def _release(self, ticket: Ticket) -> None:
        """The operation ended: admission opens, and the decider has learnt it before this returns (the observer
        kicked next reads Docker as no longer overruled). Not under `_lock`: the reconciler takes it."""
        with self._lock:
            self._busy = None
            self._changed.notify_all()
        try:
            self._propose(OpEnded(ticket.id))  # a later operation's OpBegan may come first: the decider keeps it
        except ReconcilerTimeout as exc:  # a wedged reconciler: the watchdog restarts the panel (docs/engine.md)
            self._caught("telling the reconciler an operation ended", exc)

    def _submit(self, action: str, profile_id: str | None, fn: Callable[[Ticket], None]) -> Ticket:
        with self._lock:
            if self._closed:
                return self._refused(action, profile_id, "refused: the panel is shutting down")
            if self._busy is not None:
                b = self._busy
                if action in MUTATING and b.action not in MUTATING and (holder := self.oplock.holder()) is not None:
                    return self._refused(action, profile_id, str(LockHeld(holder)))  # the writer whose boot we watch
                what = f"{b.action} to {b.profile_id}" if b.profile_id else b.action
                return self._refused(action, profile_id, f"refused: a {what} is already in progress — wait for it to finish")
            if action in MUTATING:
                try:
                    self.oplock.acquire(self.options.actor, action, profile_id or "")
                except LockHeld as exc:
                    return self._refused(action, profile_id, str(exc))
                except OSError as exc:
                    return self._refused(action, profile_id, f"refused: cannot take the engine lock {self.oplock.path} "
                                                             f"({exc.strerror or exc}); is the data dir writable?")
            ticket = Ticket(next(self._ids), action, profile_id, True, f"{action} accepted")
            self._admit(ticket)
        threading.Thread(target=self._run_op, args=(ticket, fn), name=f"engine-{action}", daemon=True).start()
        return ticket

    def _run_op(self, ticket: Ticket, fn: Callable[[Ticket], None]) -> None:
        if ticket.action == "stop":
            self._cancel.clear()
            self._wake.clear()
        try:
            fn(ticket)
        except Exception as exc:  # a bug or a vanished daemon: surface it, never leave the op hanging
            d = self._runtime_failure(exc)
            self._fail(d, f"{ticket.action} failed: {exc}")
            ticket.ok, ticket.diagnosis, ticket.message = False, d, f"{ticket.action} failed: {exc}"
            oplog.caught("engine", exc, f"the {ticket.action} operation", traceback=not isinstance(exc, RuntimeUnavailable))
        finally:
            ticket.finished = time.time()
            self._end_drain_note()  # an operation that ended another way (an error) leaves no drain said
            if ticket.action in MUTATING:
                self.oplock.release()
            self._release(ticket)
            self._obs.kick()  # re-read Docker now that this process's belief no longer wins
            ticket._done.set()
            for cb in list(self._op_listeners):
                try:
                    cb(ticket)
                except Exception as exc:  # a listener (the /metrics counters) never breaks an operation
                    self._caught("an operation listener", exc, traceback=True)

    def _op_start(self, ticket: Ticket, profile_id: str, spec: RunSpec, overrides: frozenset[str]) -> None:
        self._reconcile_now()  # Docker may show an engine this snapshot did not know of yet
        if isinstance(verdict := self._ask(MayStart(ticket.id)), EndOp):  # live already, or a stop cancelled it
            ticket.ok, ticket.message = verdict.ok, verdict.message
            return
        self._finish(ticket, self._boot(profile_id, spec, overrides))

    def _op_stop(self, ticket: Ticket, who: str) -> None:
        self._drain(ticket, who, expected_back_s=0.0)
        self._stop_engine("stopped by user" if self.options.actor == "panel" else f"stopped by {self.options.actor}")
        self._end_drain_note()  # stopped: nobody starts an answer on it any more
        ticket.ok, ticket.message = True, "engine stopped"

    def _op_switch(self, ticket: Ticket, profile_id: str, spec: RunSpec, overrides: frozenset[str], who: str) -> None:
        result = "failed"
        try:
            result = self._switch(ticket, profile_id, spec, overrides, who)
        finally:  # counted in the data dir's supervision file (every process's switches: the CLI's `engine status`
            # and the Service tab agree, history.py) and in the snapshot, the one source for /metrics
            # (switches_total{result}); the next supervision pass holds the snapshot to the file
            self.history.switched(result)
            self._propose(SwitchEnded(result))

    def _switch(self, ticket: Ticket, profile_id: str, spec: RunSpec, overrides: frozenset[str], who: str) -> str:
        """Returns the result label: ok, rolled_back, failed or cancelled."""
        self._reconcile_now()
        # the decider's word at each step (decider/step.py): already serving, cancelled by a stop, what to roll
        # back to; this worker only carries it out
        verdict = self._ask(SwitchAsked(ticket.id, profile_id, spec.labels_dict.get(BUILD_LABEL, "")))
        if not isinstance(verdict, SwitchFrom):
            return self._ended(ticket, verdict)
        rollback_to, rollback_build = verdict.profile_id, verdict.build  # what served: a rollback brings it back
        self._drain(ticket, who, expected_back_s=self.expected_boot_s(profile_id))
        if not isinstance(verdict := self._ask(SwitchDrained(ticket.id, profile_id)), Proceed):
            return self._ended(ticket, verdict)  # a stop came during the drain: it stops the engine
        stopped = self._stop_and_release(f"switching to {profile_id}")
        self._end_drain_note()  # the old engine is gone (or failed to go): the next one is not the drained one
        if not stopped:
            self._finish(ticket, False)
            return "failed"
        if self._boot(profile_id, spec, overrides):
            self._finish(ticket, True)
            return "ok"
        failure = self.snapshot().diagnosis
        verdict = self._ask(SwitchFailed(profile_id, rollback_to, rollback_build, self.options.auto_rollback, ticket.id))
        if isinstance(verdict, EndOp) and verdict.result == "cancelled":
            return self._ended(ticket, verdict)
        if not isinstance(verdict, RollBack):  # the decider's word: no rollback (not asked, nothing served before)
            self._finish(ticket, False)
            return "failed"
        rollback_to, rollback_build = verdict.profile_id, verdict.build
        self._stop_and_release(f"rolling back to {rollback_to}")
        ok = self._boot_profile(rollback_to, rollback_build)
        title = failure.title if failure else "failed"
        oplog.decision("engine", "rollback", who=oplog.PANEL, failed=profile_id, to=rollback_to, ok=ok, why=title)
        if ok:
            self._apply(sm.Noted(f"switch to {profile_id} failed ({title}); rolled back to {rollback_to}", failure))
            d = self.desired_store.write("serve", rollback_to, f"{self.options.actor} (rollback)", rollback_build)
            self._apply(sm.Supervised(desired=d.key))
        ticket.ok, ticket.diagnosis = False, failure
        ticket.message = (f"switch to {profile_id} failed: {title}; "
                          + (f"rolled back to {rollback_to}" if ok else f"rollback to {rollback_to} failed too"))
        return "rolled_back" if ok else "failed"

    @staticmethod
    def _ended(ticket: Ticket, verdict: Command) -> str:
        """The decider ended the operation (`EndOp`): its ticket says so; returns the switch counters' label."""
        if not isinstance(verdict, EndOp):
            raise TypeError(f"not an operation's end: {verdict!r}")
        ticket.ok, ticket.message = verdict.ok, verdict.message
        return verdict.result if verdict.result != "refused" else "failed"

    def _finish(self, ticket: Ticket, ok: bool) -> None:
        snap = self.snapshot()
        ticket.ok = ok
        ticket.diagnosis = None if ok else snap.diagnosis
        ticket.message = (f"{snap.profile_id} ready" if ok else
                          f"{ticket.action} failed: {snap.diagnosis.title if snap.diagnosis else snap.message}")
        # the operator's log says when the start/switch ended and how long it took (issue 49: no "ready" line)
        oplog.decision("engine", "ready" if ok else f"{ticket.action}_failed", who=self.options.actor.lower(),
                       profile=snap.profile_id if ok else ticket.profile_id, gpu=self.options.gpu,
                       after_s=round(time.time() - ticket.started, 1), why=None if ok else ticket.message)

    def _fail(self, d: Diagnosis, message: str) -> None:
        snap = self._apply(sm.Failed(d, message))
        if snap.container_id:  # a run this panel judged (pool not loaded, boot timeout): any process reads it
            self._exit_records.record(snap.container_id, d)

    # -- drain (docs/engine.md, "Keeps serving") ---------------------------------------------
    def drain_grace_s(self) -> float:
        """Seconds a stop/switch waits for the answers in flight: options, else the Service tab, else the recipe."""
        o = self.options
        if o.drain_grace_s is not None:
            return max(0.0, o.drain_grace_s)
        if o.drain_grace_fn is not None:
            try:
                v = o.drain_grace_fn()
            except (OSError, ValueError) as exc:  # an unreadable settings file: the recipe's value
                self._caught("reading the drain grace setting", exc)
                v = None
            if v is not None:
                return max(0.0, float(v))
        return float(self.recipe.engine.drain_grace_s)

    def expected_boot_s(self, profile_id: str | None = None) -> float:
        """Seconds until the engine serves again after a stop of the current run: the last measured boot of
        that profile (history.py); 0 when never measured (the gateway then says "unknown")."""
        pid = profile_id or self._snap.profile_id
        return self.history.read().boot_seconds(pid) or 0.0

    def _answers_in_flight(self) -> int:
        n = 0
        for c in list(self._counters):
            try:
                n += max(0, int(c.answers_in_flight()))
            except Exception as exc:  # a broken counter never blocks a stop: it counts as 0
                self._caught("counting the answers in flight", exc, traceback=True)
        return n

    def _note_drain(self, draining: bool, in_flight: int = 0, deadline: float = 0.0, expected_back_s: float = 0.0) -> None:
        """Tell the other processes on this data dir (a panel beside this CLI) that this engine drains, so their
        gateway and Chat tab start no new answer on it meanwhile (drainnote.py)."""
        try:
            self.drain_notes.publish(draining, in_flight, deadline, expected_back_s)
        except OSError as exc:  # a full disk: the drain goes on; the others then only see the engine go
            self._caught("publishing the drain for other processes", exc)

    def _end_drain_note(self) -> None:
        """The drained engine stopped (or the operation ended): this process's drain note, if it still says
        draining, says it no longer does."""
        try:
            self.drain_notes.end_own()
        except OSError as exc:  # a full disk: the note goes stale at its deadline anyway (drainnote.LATE_S)
            self._caught("ending the drain note for other processes", exc)

    def _drain(self, ticket: Ticket, who: str, *, expected_back_s: float) -> None:
        """Wait, draining, until no answer is in flight, the grace ends, `switch_now()`, or a stop cancels."""
        self._drain_now.clear()
        snap = self._snap
        serving = snap.state in (EngineState.READY, EngineState.STALLED)
        n = self._answers_in_flight() if serving else 0
        grace = self.drain_grace_s()
        if n == 0 and serving and grace > 0:
            # draining first, then counted again: a request the gateway admitted in the instant of the first
            # count (before it saw the drain) is then in flight and waited for, not cut (seen under a client
            # calling in a loop through a fleet's front, docs/fleet.md#the-fault-table)
            self._apply(sm.Draining(True, 0, time.time() + grace, expected_back_s))
            self._drain_now.wait(DRAIN_SETTLE_S)
            n = self._answers_in_flight()
        if n == 0 or grace <= 0:
            self._apply(sm.Draining(False, 0, 0.0, expected_back_s))  # the gateway's Retry-After for the boot
            return
        deadline = time.time() + grace
        if self._drain_carry > time.time():  # a stop that cancelled a switch's drain keeps its deadline
            deadline = min(deadline, self._drain_carry)
        self._drain_carry = 0.0
        self._apply(sm.Draining(True, n, deadline, expected_back_s))
        self._note_drain(True, n, deadline, expected_back_s)
        oplog.decision("engine", "drain", who=who, op=ticket.action, in_flight=n, grace_s=grace)
        try:
            while n > 0 and time.time() < deadline and not (self._drain_now.is_set() or self._cancel.is_set()
                                                             or self._closed):
                self._drain_now.wait(DRAIN_POLL_S)
                m = self._answers_in_flight()
                if m != n:
                    n = m
                    self._apply(sm.Draining(True, n, deadline, expected_back_s))
                    self._note_drain(True, n, deadline, expected_back_s)
        finally:
            # otherwise kept until the engine has stopped (_end_drain_note): it stops next, and another process's
            # gateway must not start an answer on it in between (docs/gateway.md "One gateway")
            if self._cancel.is_set() or self._closed:
                self._note_drain(False)
        ended = ("answers finished" if n == 0 else "switch now" if self._drain_now.is_set() else
                 "cancelled" if self._cancel.is_set() or self._closed else "grace ended")
        if ended == "cancelled":
            self._drain_carry = deadline
        oplog.decision("engine", "drain_end", who=who, op=ticket.action, left=n, ended=ended)
        self._apply(sm.Draining(False, 0, 0.0, expected_back_s))
