"""Operations, each on its own worker thread (docs/engine.md, "Start, stop, switch"): start, stop and switch
with its rollback, and the desired state a person's start/stop/switch records. Each script carries out the
decider's word at each step (decider/step.py: may it boot, already serving, cancelled by a stop, roll back to
what): admission (admission.py) runs it, boot.py boots and stops, drain.py drains.
"""

from __future__ import annotations

import threading

from app.backend import oplog
from app.backend.engine.control.admission import Admission, ask
from app.backend.engine.control.boot import Boot
from app.backend.engine.control.drain import Drain
from app.backend.engine.control.observer import Observer
from app.backend.engine.control.reconciler import Reconciler, ReconcilerTimeout
from app.backend.engine.control.site import Site
from app.backend.engine.control.supervisor import Wishes
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.decider.facts import (Command, EndOp, MayStart, Proceed, RollBack, SwitchAsked, SwitchDrained,
                                              SwitchEnded, SwitchFailed, SwitchFrom)
from app.backend.engine.lifecycle.oplock import LockHeld
from app.backend.engine.lifecycle.tickets import Ticket
from app.backend.engine.runtime.base import BUILD_LABEL, Instance, Runtime
from app.backend.engine.supervision.desired import DesiredKind
from app.backend.engine.supervision.history import SupervisionStore
from app.backend.recipe.command import RunSpec


class Operations:
    """The scripts of start, stop and switch; they own no state of their own beyond their collaborators."""

    def __init__(self, site: Site, rec: Reconciler, admission: Admission, boot: Boot, drain: Drain,
                 observer: Observer, wishes: Wishes, history: SupervisionStore) -> None:
        self.site, self.options = site, site.options
        self.rec = rec
        self.admission = admission
        self.boot = boot
        self.drain = drain
        self.observer = observer
        self.wishes = wishes
        self.history = history

    # -- what a person (the UI, the CLI) asks -----------------------------------------------------------------
    def start(self, profile_id: str, overrides: frozenset[str], who: str, build: str | None) -> Ticket:
        spec = self._spec_for("start", profile_id, build)
        if isinstance(spec, Ticket):
            return self._intent(spec, "serve", profile_id, who, build)
        try:
            verdict = ask(self.rec, MayStart())  # an engine is live: a switch changes it
        except ReconcilerTimeout as exc:  # a wedged reconciler: refused, said (the watchdog restarts the panel)
            verdict = EndOp(False, f"refused: {exc}", "refused")
        if isinstance(verdict, EndOp):
            return self._intent(self.admission.refused("start", profile_id, verdict.message), "serve", profile_id,
                                who, build)
        t = self.admission.submit("start", profile_id, lambda t: self._op_start(t, profile_id, spec, overrides))
        return self._intent(t, "serve", profile_id, who, build)

    def stop(self, who: str) -> Ticket:
        """A serving engine first drains its answers in flight; a start/switch still booting is cancelled first."""
        def then_stop(busy: Ticket, ticket: Ticket, have_lock: bool) -> None:
            threading.Thread(target=self._stop_after, args=(busy, ticket, who, have_lock), name="engine-stop",
                             daemon=True).start()

        cancelling = self.admission.cancel_for_stop(then_stop)
        if isinstance(cancelling, str):
            return self._intent(self.admission.refused("stop", None, cancelling), "stopped", None, who)
        if cancelling is not None:
            return self._intent(cancelling, "stopped", None, who)
        return self._intent(self.admission.submit("stop", None, lambda t: self._op_stop(t, who)), "stopped", None, who)

    def switch(self, profile_id: str, overrides: frozenset[str], who: str, build: str | None) -> Ticket:
        spec = self._spec_for("switch", profile_id, build)
        if isinstance(spec, Ticket):
            return self._intent(spec, "serve", profile_id, who, build)
        t = self.admission.submit("switch", profile_id, lambda t: self._op_switch(t, profile_id, spec, overrides, who))
        return self._intent(t, "serve", profile_id, who, build)

    def watch_boot(self, rt: Runtime, inst: Instance) -> None:
        """An engine booting that nobody here gates (the decider's `WatchBoot`): gate it on ready in a watch-only
        op (no lock: another writer's run)."""
        self.admission.submit("adopt", inst.profile_id, lambda t: self.admission.finish(
            t, self.boot.await_ready(rt, inst, inst.env, watch_only=True)))

    def expected_boot_s(self, profile_id: str | None = None) -> float:
        """Seconds until the engine serves again after a stop of the current run: the last measured boot of
        that profile (history.py); 0 when never measured (the gateway then says "unknown")."""
        pid = profile_id or self.rec.snapshot().profile_id
        return self.history.read().boot_seconds(pid) or 0.0

    def _intent(self, ticket: Ticket, kind: DesiredKind, profile_id: str | None, who: str,
                build: str | None = None) -> Ticket:
        """An accepted start/stop/switch is the user's intent: persist it (a refused one changes nothing) and log
        the decision with who asked."""
        oplog.decision("engine", ticket.action, who=who, profile=profile_id, gpu=self.options.gpu,
                       accepted=ticket.accepted, note=None if ticket.accepted else ticket.message)
        if ticket.accepted:
            self.wishes.record(kind, profile_id, build)
        return ticket

    def _stop_after(self, busy: Ticket, ticket: Ticket, who: str, have_lock: bool = False) -> None:
        busy.wait()
        self.admission.admit_when_idle(ticket)
        try:
            if not have_lock:
                self.admission.oplock.acquire(self.options.actor, "stop")
        except (LockHeld, OSError) as exc:  # another process took over meanwhile, or a full disk took the note
            ticket.ok, ticket.message = False, str(exc)
            self.admission.release(ticket)
            ticket._done.set()
            return
        self.admission.run(ticket, lambda t: self._op_stop(t, who))

    def _spec_for(self, action: str, profile_id: str, build: str | None = None) -> RunSpec | Ticket:
        """The operation's one spec (one profile and build lookup), or its refusal naming the operation."""
        try:
            return self.site.run_spec(profile_id, build=build)
        except (KeyError, ValueError) as exc:
            return self.admission.refused(action, profile_id, f"refused: {exc.args[0] if exc.args else exc}")

    def _op_start(self, ticket: Ticket, profile_id: str, spec: RunSpec, overrides: frozenset[str]) -> None:
        self.observer.sync_for_op()  # Docker may show an engine this snapshot did not know of yet
        if isinstance(verdict := ask(self.rec, MayStart(ticket.id)), EndOp):  # live already, or a stop cancelled it
            ticket.ok, ticket.message = verdict.ok, verdict.message
            return
        self.admission.finish(ticket, self.boot.boot(profile_id, spec, overrides))

    def _op_stop(self, ticket: Ticket, who: str) -> None:
        self.drain.drain(ticket, who, expected_back_s=0.0)
        self.boot.stop_engine("stopped by user" if self.options.actor == "panel" else f"stopped by {self.options.actor}")
        self.drain.end_note()  # stopped: nobody starts an answer on it any more
        ticket.ok, ticket.message = True, "engine stopped"

    def _op_switch(self, ticket: Ticket, profile_id: str, spec: RunSpec, overrides: frozenset[str], who: str) -> None:
        result = "failed"
        try:
            result = self._switch(ticket, profile_id, spec, overrides, who)
        finally:  # counted in the data dir's supervision file (every process's switches: the CLI's `engine status`
            # and the Service tab agree, history.py) and in the snapshot, the one source for /metrics
            # (switches_total{result}); the next supervision pass holds the snapshot to the file
            self.history.switched(result)
            self.rec.propose(SwitchEnded(result))

    def _switch(self, ticket: Ticket, profile_id: str, spec: RunSpec, overrides: frozenset[str], who: str) -> str:
        """Returns the result label: ok, rolled_back, failed or cancelled."""
        self.observer.sync_for_op()
        # the decider's word at each step (decider/step.py): already serving, cancelled by a stop, what to roll
        # back to; this worker only carries it out
        verdict = ask(self.rec, SwitchAsked(ticket.id, profile_id, spec.labels_dict.get(BUILD_LABEL, "")))
        if not isinstance(verdict, SwitchFrom):
            return self._ended(ticket, verdict)
        rollback_to, rollback_build = verdict.profile_id, verdict.build  # what served: a rollback brings it back
        self.drain.drain(ticket, who, expected_back_s=self.expected_boot_s(profile_id))
        if not isinstance(verdict := ask(self.rec, SwitchDrained(ticket.id, profile_id)), Proceed):
            return self._ended(ticket, verdict)  # a stop came during the drain: it stops the engine
        stopped = self.boot.stop_and_release(f"switching to {profile_id}")
        self.drain.end_note()  # the old engine is gone (or failed to go): the next one is not the drained one
        if not stopped:
            self.admission.finish(ticket, False)
            return "failed"
        if self.boot.boot(profile_id, spec, overrides):
            self.admission.finish(ticket, True)
            return "ok"
        failure = self.rec.snapshot().diagnosis
        verdict = ask(self.rec, SwitchFailed(profile_id, rollback_to, rollback_build, self.options.auto_rollback, ticket.id))
        if isinstance(verdict, EndOp) and verdict.result == "cancelled":
            return self._ended(ticket, verdict)
        if not isinstance(verdict, RollBack):  # the decider's word: no rollback (not asked, nothing served before)
            self.admission.finish(ticket, False)
            return "failed"
        rollback_to, rollback_build = verdict.profile_id, verdict.build
        self.boot.stop_and_release(f"rolling back to {rollback_to}")
        ok = self.boot.boot_profile(rollback_to, rollback_build)
        title = failure.title if failure else "failed"
        oplog.decision("engine", "rollback", who=oplog.PANEL, failed=profile_id, to=rollback_to, ok=ok, why=title)
        if ok:
            self.rec.apply(sm.Noted(f"switch to {profile_id} failed ({title}); rolled back to {rollback_to}", failure))
            d = self.wishes.store.write("serve", rollback_to, f"{self.options.actor} (rollback)", rollback_build)
            self.rec.apply(sm.Supervised(desired=d.key))
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
