"""Log following, engine-exit detection and reattach: the part of EngineController that runs on the
follower threads. A mixin over the controller's state (lock, log store, boot tracker, `_apply`)."""

from __future__ import annotations

import calendar
import threading
import time

from app.backend.engine import statemachine as sm
from app.backend.engine.bootlog import BootTracker
from app.backend.engine.diagnosis import cache_miss_warning
from app.backend.engine.ops import expects_pool
from app.backend.engine.readiness import base_url, probe
from app.backend.engine.runtime import MANAGED_LABEL, RECIPE_LABEL, Instance, Runtime, RuntimeOpError, RuntimeUnavailable, Stream
from app.backend.engine.types import EngineState, LogLine

S = EngineState


class LogFollowing:
    # -- logs ----------------------------------------------------------------------------------
    def _begin_follow(self, rt: Runtime, inst: Instance, *, from_start: bool, tracker: BootTracker | None = None,
                      backlog: list[tuple[Stream, str]] | None = None) -> None:
        self._end_follow()
        with self._lock:
            self._run_token += 1
            token = self._run_token
            self._tracker = tracker or BootTracker()
            self._streams_open = 2
        self.logs.begin_run(inst.name, _started_epoch(inst.started_at))
        for stream, text in backlog or []:  # already persisted by whoever followed this run before
            self.logs.append(LogLine(text=text, stream=stream, container_id=inst.id), persist=False)
        follow = rt.follow_logs(inst.id, lambda s, t: self._on_line(token, inst.id, s, t),
                                from_start=from_start, tail=0)
        with self._lock:
            self._follow = follow

    def _end_follow(self) -> None:
        with self._lock:
            follow, self._follow = self._follow, None
            self._run_token += 1
        if follow is not None:
            follow.close()
        self.logs.end_run()

    def _drain_logs(self, timeout: float = 3.0) -> None:
        """Give the followers a moment to deliver the last lines of an exited engine."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self._streams_open <= 0:
                    return
            time.sleep(0.02)

    def _on_line(self, token: int, cid: str, stream: Stream, text: str | None) -> None:
        with self._lock:
            if token != self._run_token:
                return
            if text is None:
                self._streams_open -= 1
                ended = self._streams_open == 0
            else:
                ended = False
        if text is None:
            if ended:
                self._on_streams_ended(token, cid)
            return
        self.logs.append(LogLine(text=text, stream=stream, container_id=cid))
        with self._lock:
            if token != self._run_token or not self._tracker.feed(text):
                return
            p = self._tracker.progress
            if self._snap.state is S.STARTING:
                msg = cache_miss_warning() if p.cache_miss else ""
                self._apply(sm.BootProgressed(p.phase, p.pool_slots, p.slot_mib, msg))

    def _on_streams_ended(self, token: int, cid: str) -> None:
        """Both log streams ended: the engine exited. Outside an operation, a READY engine has died."""
        if cid in self._expected_exit or self._closed:
            return
        threading.Thread(target=self._watch_exit, args=(token, cid), name="engine-exit", daemon=True).start()

    def _watch_exit(self, token: int, cid: str) -> None:
        rt = self._runtime
        if rt is None:
            return
        cur = rt.wait(cid, 5.0)
        with self._lock:
            if token != self._run_token or self._busy is not None or cid in self._expected_exit:
                return  # an operation owns this container; it reports the exit itself
            if self._snap.state is not S.READY or self._snap.container_id != cid:
                return
            if cur is not None and cur.running:  # only the log stream broke (daemon hiccup): follow again
                self._begin_follow(rt, cur, from_start=False, tracker=self._tracker)
                return
            self._fail_exited(cur)

    # -- reattach ------------------------------------------------------------------------------
    def _reattach(self) -> None:
        rt = self._get_runtime()
        if rt is None:
            return
        try:
            running = [i for i in rt.list({MANAGED_LABEL: "1", RECIPE_LABEL: self.recipe.id}) if i.running]
        except (RuntimeUnavailable, RuntimeOpError) as exc:
            self._apply(sm.Noted(str(exc)))
            return
        if not running:
            return
        inst = sorted(running, key=lambda i: i.started_at)[-1]
        tracker = BootTracker()
        old = rt.read_logs(inst.id, max_lines=20000)
        for _, text in old:
            tracker.feed(text)
        self._begin_follow(rt, inst, from_start=False, tracker=tracker, backlog=old[-300:])
        prog = tracker.progress
        p = probe(base_url(self.recipe), self.recipe.model.served_name)
        ready = p.health_ok and p.models_ok and (not expects_pool(inst.env, self.recipe.engine.pool_line) or (prog.pool_slots or 0) > 0)
        self._apply(sm.Adopted(inst.profile_id, inst.id, inst.name, base_url(self.recipe), self.recipe.model.served_name,
                               self.recipe.simulated, ready, prog.phase, prog.pool_slots, prog.slot_mib))
        if len(running) > 1:
            self._apply(sm.Noted(f"reattached to {inst.name}; {len(running) - 1} other panel engine(s) are also "
                                 "running — stop them (never started twice by this panel)"))
        if not ready:
            self._submit("adopt", inst.profile_id, lambda t: self._finish(t, self._await_ready(rt, inst, inst.env)))


def _started_epoch(started_at: str) -> float:
    """Docker/ProcessRuntime ISO start time -> epoch (names the run's log files; same run, same files)."""
    try:
        return float(calendar.timegm(time.strptime(started_at[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return time.time()
