"""Liveness after ready (docs/engine.md, "Liveness"): its own thread (`engine-liveness`) reads the engine's
/metrics once a second (the engine client's shared read) and, while idle, sends the generation canary. A
verdict (stalled, unstalled, a canary reading) is a fact (`Judged`) whose rule the pure step checks: the run it
judged is still shown and no operation is under way.
"""

from __future__ import annotations

import threading
import time

import httpx

from app.backend import oplog
from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.decider.facts import Judged
from app.backend.engine.supervision.canary import CanaryState, Load, canary_diagnosis, load_from_metrics, send_canary
from app.backend.engine.runtime.client import engine_client
from app.backend.engine.control.reconciler import Reconciler, join_thread
from app.backend.engine.control.site import Site
from app.backend.engine.control.supervisor import Supervisor
from app.backend.engine.errlog import ErrorsOnce
from app.backend.engine.logs.logstore import LogStore
from app.backend.engine.supervision.stall import LivenessTracker, progress_from_metrics, stall_diagnosis


class Liveness:
    """Owns the stall tracker, the canary's state and history, and its thread."""

    def __init__(self, site: Site, rec: Reconciler, logs: LogStore, supervisor: Supervisor, errors: ErrorsOnce,
                 closing: threading.Event) -> None:
        self.options, self.recipe = site.options, site.recipe
        self.rec = rec
        self.logs = logs
        self.supervisor = supervisor  # the stall restart and the policy are the supervisor's
        self.errors = errors
        self.closing = closing
        self._tracker = LivenessTracker(self._stall_after())
        self._tracker_for = ""  # the run the tracker's readings belong to
        self.canary = CanaryState(*self._canary_settings())
        self._canary_for = ""  # the container the canary history belongs to
        self._canary_retry_at = 0.0
        self.canary_in_flight = threading.Event()  # set while a canary request is out (bench/canary_cost.py)
        self._stall_source = ""  # "metrics" (tokens froze with requests running) | "canary"
        self._thread = threading.Thread(target=self._loop, name="engine-liveness", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        join_thread(self._thread, timeout)

    def _loop(self) -> None:
        while not self.closing.is_set():
            # the canary goes when due, not at the next 1 s tick (detection: docs/engine.md, "Liveness")
            until = self.canary.seconds_until_due(time.monotonic())
            self.closing.wait(max(0.05, min(self.options.liveness_poll_s, until)))
            if self.closing.is_set():
                return
            try:
                self._check_liveness()
            except Exception as exc:  # like the observer: survive, say why once
                self.errors.caught("checking the engine's liveness", exc, traceback=True)

    def _check_liveness(self) -> None:
        snap = self.rec.snapshot()
        # no reading during an operation of this process (the decider drops a verdict then anyway)
        if snap.state not in (EngineState.READY, EngineState.STALLED) or not snap.base_url or self.rec.decided.op:
            return
        if snap.container_id != self._tracker_for:  # a new run (booted, adopted): its own readings
            self._tracker_for = snap.container_id
            self._tracker.reset()
        if snap.container_id != self._canary_for:  # a new run: its own canary history
            self._canary_for = snap.container_id
            # its interval runs from when it became ready, not from this check up to a poll later
            self.canary.reset(time.monotonic() - max(0.0, time.time() - snap.since))
        if snap.state is EngineState.READY:
            self._stall_source = ""
        try:
            # The one engine client's read, shared with the telemetry's scrape of the same second
            # (docs/engine.md, "Engine client"): one GET /metrics a second, not two.
            read = engine_client(snap.base_url).metrics(max_age_s=self.options.liveness_poll_s,
                                                        timeout=httpx.Timeout(2.0, connect=1.0))
            now = time.monotonic()
            verdict = self._tracker.feed(progress_from_metrics(read.text, read.monotonic))
            load = load_from_metrics(read.text)
        except (httpx.HTTPError, ValueError):
            return
        if self._stall_source != "canary" and self._canary_tick(snap, load, now):
            return
        if self.rec.decided.op or self.rec.snapshot().container_id != snap.container_id:
            return
        cid = snap.container_id
        if verdict.stalled and self.rec.snapshot().state is EngineState.READY:
            tail = tuple(ln.text for ln in self.logs.recent(5))
            stalled = sm.Stalled(stall_diagnosis(verdict.running, verdict.idle_s, self._stall_after(), tail),
                                 f"stalled: {int(verdict.running)} request(s) running, no token for "
                                 f"{verdict.idle_s:.0f} s")
            if not self.rec.propose(Judged(cid, EngineState.READY, (stalled,)))[0]:
                return
            self._stall_source = "metrics"
            oplog.decision("engine", "stalled", who=oplog.SUPERVISOR, source="metrics", container=cid[:12],
                           running=int(verdict.running), idle_s=round(verdict.idle_s))
            if self._restart_on_stall() and snap.profile_id:
                self.supervisor.restart_stalled(snap.profile_id)
        elif (not verdict.stalled and self.rec.snapshot().state is EngineState.STALLED and self._stall_source == "metrics"
              or self._stall_source == "canary" and self._canary_recovered(snap, load)):
            unstalled = sm.Unstalled("tokens are moving again")
            if self.rec.propose(Judged(cid, EngineState.STALLED, (unstalled,)))[0]:
                self._stall_source = ""

    def _canary_settings(self) -> tuple[float, float]:
        o, e = self.options, self.recipe.engine
        interval = o.canary_interval_s if o.canary_interval_s is not None else (e.canary_interval_s if o.supervise
                                                                                else 0.0)
        return interval, o.canary_timeout_s if o.canary_timeout_s is not None else e.canary_timeout_s

    def _canary_tick(self, snap: EngineSnapshot, load: Load, now: float) -> bool:
        """Send a canary when one is due (idle, no proof for interval_s); True when it judged the engine stalled."""
        if snap.state is not EngineState.READY or not self.canary.due(load, now):
            return False
        while True:
            sent_at = time.monotonic()
            self.canary_in_flight.set()
            try:
                result = send_canary(snap.base_url, snap.served_name, self.canary.timeout_s,
                                     arrived=self._user_arrived)
            finally:
                self.canary_in_flight.clear()
            stalled = self.canary.record(result, sent_at)
            # one failure: the second try goes at once, if still idle (detection <= interval + 2 x timeout)
            if stalled or result.outcome != "failed" or self._user_arrived() or self.closing.is_set():
                break
            self.rec.apply(self._canary_event())
        events: list[sm.Event] = [self._canary_event()]
        if stalled:
            tail = tuple(ln.text for ln in self.logs.recent(5))
            events.append(sm.Stalled(canary_diagnosis(result.detail, self.canary.interval_s, tail),
                                     f"stalled: the generation canary failed twice ({result.detail})"))
        cid = snap.container_id
        if not self.rec.propose(Judged(cid, EngineState.READY, tuple(events)))[0]:
            return True
        if not stalled:
            return False
        self._stall_source = "canary"
        oplog.decision("engine", "stalled", who=oplog.SUPERVISOR, source="canary", container=cid[:12])
        if self._restart_on_stall() and snap.profile_id:
            self.supervisor.restart_stalled(snap.profile_id)
        return True

    def _canary_event(self) -> sm.Supervised:
        """The canary's status line and its last judged reading, for the snapshot (and /metrics from it)."""
        c, r = self.canary, self.canary.last
        judged = r is not None and r.outcome != "yielded"
        return sm.Supervised(canary=c.status(), canary_failures_total=c.failures_total,
                             canary_ok=(r.outcome == "ok") if judged and r is not None else None,
                             canary_at=c.last_at if judged else None,
                             canary_latency_s=r.seconds if judged and r is not None else None)

    def _canary_recovered(self, snap: EngineSnapshot, load: Load) -> bool:
        """A canary-stalled engine (restart off) is re-tried every interval; a success ends the stall."""
        if time.monotonic() - self._canary_retry_at < max(self.canary.interval_s, 1.0) or load.waiting or load.running:
            return False
        self._canary_retry_at = time.monotonic()
        r = send_canary(snap.base_url, snap.served_name, self.canary.timeout_s, arrived=self._user_arrived)
        if r.outcome != "ok":
            return False
        self.canary.record(r, time.monotonic())
        self.rec.apply(self._canary_event())
        return True

    def _user_arrived(self) -> bool:
        """While a canary runs: does a request wait (it would wait behind the canary with --max-num-seqs 1)?"""
        url = self.rec.snapshot().base_url
        try:
            read = engine_client(url).metrics(timeout=httpx.Timeout(1.0, connect=0.5))  # fresh: no max_age_s
            return load_from_metrics(read.text).waiting > 0
        except (httpx.HTTPError, ValueError):
            return False

    def _stall_after(self) -> float:
        v = self.options.stall_after_s
        return float(v if v is not None else self.recipe.engine.stall_after_s)

    def _restart_on_stall(self) -> bool:
        v = self.options.restart_on_stall
        if v is not None:
            return v
        return self.recipe.engine.restart_on_stall or (self.options.supervise and self.supervisor.restart_policy() == "on-failure")
