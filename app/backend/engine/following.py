"""Log following, the Docker watch (observed state) and adoption: the part of EngineController that runs on
background threads. A mixin over the controller's state (lock, log store, boot tracker, `_apply`).

Observed state (docs/engine.md, "One truth"): the containers carrying this panel's labels are the truth.
A watch thread reads Docker's event stream for those labels and a reconcile thread re-reads the
containers on every event and every `resync_s` (the safety net when an event is missed). Only while
this process has an operation in flight does its own belief win; otherwise every start, stop,
replacement or kill by anyone is adopted or explained within a couple of seconds.
"""

from __future__ import annotations

import calendar
import threading
import time
from dataclasses import replace
from typing import Any

import httpx

from app.backend.engine import statemachine as sm
from app.backend.engine.bootlog import BootTracker
from app.backend.engine.diagnosis import cache_miss_warning
from app.backend.engine.exits import explain_exit, is_failure
from app.backend.engine.liveness import LivenessTracker, progress_from_metrics
from app.backend.engine.ops import expects_pool
from app.backend.engine.readiness import base_url, probe
from app.backend.engine.runtime import MANAGED_LABEL, RECIPE_LABEL, Instance, Runtime, RuntimeOpError, RuntimeUnavailable, Stream
from app.backend.engine.types import LIVE_STATES, Diagnosis, EngineState, LogLine

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
            # Boot regexes only while booting: after ready a line cannot change the boot picture.
            if token != self._run_token or self._snap.state not in (S.PREFLIGHT, S.STARTING) \
                    or not self._tracker.feed(text):
                return
            if self._snap.state is not S.STARTING:  # first lines before BootBegan: tracked, shown next line
                return
            p = self._tracker.progress
            msg = cache_miss_warning() if p.cache_miss else ""
            self._apply(sm.BootProgressed(p.phase, p.pool_slots, p.slot_mib, msg))

    def _on_streams_ended(self, token: int, cid: str) -> None:
        """Both log streams ended: the engine probably exited; let the reconcile look at Docker now."""
        if not self._closed:
            self._kick.set()

    # -- the watch: Docker events + periodic resync -> reconcile -------------------------------
    def _start_watch(self) -> None:
        for target, name in ((self._events_loop, "engine-events"), (self._reconcile_loop, "engine-reconcile")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def _labels(self) -> dict[str, str]:
        return {MANAGED_LABEL: "1", RECIPE_LABEL: self.recipe.id}

    def _events_loop(self) -> None:
        while not self._closed:
            rt = self._runtime
            watch = getattr(rt, "events", None)
            if watch is None:  # no runtime yet, or one without events (process runtime): resync only
                self._wake_watch.wait(1.0)
                continue
            try:
                stream = watch(self._labels())
                with self._lock:
                    self._events_stream = stream
                for _ in stream:
                    if self._closed:
                        break
                    self._kick.set()
            except Exception:  # daemon restarted / stream cut: the resync covers the gap, retry shortly
                pass
            finally:
                with self._lock:
                    self._events_stream = None
            self._wake_watch.wait(1.0)

    def _reconcile_loop(self) -> None:
        next_live = 0.0
        while not self._closed:
            self._kick.wait(min(self.options.resync_s, self.options.liveness_poll_s))
            self._kick.clear()
            if self._closed:
                return
            try:
                self._reconcile()
                if time.monotonic() >= next_live:
                    next_live = time.monotonic() + self.options.liveness_poll_s
                    self._check_liveness()
            except Exception as exc:  # the watch must survive anything; say why once
                self._watch_error = f"{type(exc).__name__}: {exc}"

    def _reconcile(self, own_op: bool = False) -> None:
        """Make the snapshot say what Docker says (skipped while this process runs an operation, unless that
        operation asks: `own_op`, at the start of a start/switch)."""
        with self._lock:
            if (self._busy is not None and not own_op) or self._closed:
                return
        rt = self._get_runtime()
        if rt is None:
            return
        try:
            mine = rt.list(self._labels())
        except (RuntimeUnavailable, RuntimeOpError) as exc:
            with self._lock:
                if (self._busy is None or own_op) and self._snap.state in LIVE_STATES:
                    base = Diagnosis("docker_unreachable", "Docker daemon unreachable", str(exc),
                                     "Is dockerd running (`systemctl status docker`)? Is DOCKER_HOST right?")
                    self._apply(sm.Failed(base, str(exc)))
            return
        running = sorted((i for i in mine if i.running), key=lambda i: i.started_at)
        snap = self.snapshot()
        if running:
            inst = running[-1]
            if snap.container_id == inst.id and snap.state in LIVE_STATES | {S.STOPPING}:
                if snap.state is S.STARTING and not own_op:
                    with self._lock:  # booting and nobody in this process waits for it (adopted inside an op)
                        if self._busy is None:
                            self._submit("adopt", inst.profile_id,
                                         lambda t: self._finish(t, self._await_ready(rt, inst, inst.env)))
                return
            self._adopt(rt, inst, len(running), own_op)
            return
        # Nothing runs. Explain the run the snapshot still shows, or (fresh process) the newest exited run.
        if snap.state in LIVE_STATES or snap.state is S.STOPPING:
            cid = snap.container_id
        elif snap.state is S.FAILED and snap.container_id:
            if not any(i.id == snap.container_id and i.status != "removing" for i in mine):
                with self._lock:  # the failed run's container was removed: nothing is there; keep why it failed
                    if self._busy is None or own_op:
                        self._apply(sm.Vanished(f"{snap.container_name or 'the engine container'} was removed "
                                                "(the last diagnosis is kept below)", snap.diagnosis))
            return  # already explained
        else:
            exited = sorted((i for i in mine if not i.running), key=lambda i: i.finished_at or i.started_at)
            if not exited or exited[-1].id in self._explained:
                return
            cid = exited[-1].id
        inst_now = next((i for i in mine if i.id == cid), None)
        self._explain(rt, inst_now, cid, own_op)

    def _explain(self, rt: Runtime, inst: Instance | None, cid: str, own_op: bool = False) -> None:
        self._explained.add(cid)
        tracker = BootTracker()
        lines: list[str] = []
        if inst is not None:
            self._drain_logs(1.0)
            with self._lock:
                followed = bool(self._snap.container_id == cid and self.logs.recent(1))
            lines = ([ln.text for ln in self.logs.recent(400)] if followed
                     else [t for _, t in rt.read_logs(cid, max_lines=20000)])
            for text in lines:
                tracker.feed(text)
        d = self._recorded_failure(cid) or explain_exit(inst, lines[-400:], cache_miss=tracker.progress.cache_miss)
        with self._lock:
            if (self._busy is not None and not own_op) or (self._snap.container_id and self._snap.container_id != cid):
                return  # an operation started meanwhile / already on another container
            if inst is None or inst.id == self._snap.container_id:
                self._end_follow()
            code = f" (exit code {inst.exit_code})" if inst is not None else ""
            if is_failure(d):
                self._apply(sm.Failed(d, f"engine exited{code}: {d.title}"))
                # keep the id (not a state change): this failed run is what the badge explains
                self._snap = replace(self._snap, container_id=cid, container_name=inst.name if inst else "")
            else:
                self._apply(sm.Vanished(f"engine {d.title}{code}", d))

    def _adopt(self, rt: Runtime, inst: Instance, n_running: int, own_op: bool = False) -> None:
        """Adopt a running panel engine (started by this panel before a restart, another panel or the CLI)."""
        tracker = BootTracker()
        old = rt.read_logs(inst.id, max_lines=20000)
        for _, text in old:
            tracker.feed(text)
        prog = tracker.progress
        p = probe(base_url(self.recipe), self.recipe.model.served_name)
        ready = p.health_ok and p.models_ok and (not expects_pool(inst.env, self.recipe.engine.pool_line) or (prog.pool_slots or 0) > 0)
        with self._lock:
            if (self._busy is not None and not own_op) or self._closed:
                return
            first = self._snap.state is S.STOPPED and not self._snap.container_id and not self._adopted_once
            self._adopted_once = True
            self._begin_follow(rt, inst, from_start=False, tracker=tracker, backlog=old[-300:])
            note = "reattached to the running engine" if first else f"adopted {inst.name} (started outside this panel)"
            self._liveness.reset()
            self._apply(sm.Adopted(inst.profile_id, inst.id, inst.name, base_url(self.recipe),
                                   self.recipe.model.served_name, self.recipe.simulated, ready, prog.phase,
                                   prog.pool_slots, prog.slot_mib, note))
            if n_running > 1:
                self._apply(sm.Noted(f"adopted {inst.name}; {n_running - 1} other panel engine(s) are also "
                                     "running — stop them (never started twice by this panel)"))
            if not ready and not own_op:
                self._submit("adopt", inst.profile_id,
                             lambda t: self._finish(t, self._await_ready(rt, inst, inst.env)))

    # -- liveness after ready ------------------------------------------------------------------
    def _check_liveness(self) -> None:
        snap = self.snapshot()
        if snap.state not in (S.READY, S.STALLED) or not snap.base_url or self._busy is not None:
            return
        try:
            r = httpx.get(f"{snap.base_url}/metrics", timeout=httpx.Timeout(2.0, connect=1.0))
            if r.status_code != 200:
                return
            verdict = self._liveness.feed(progress_from_metrics(r.text, time.monotonic()))
        except (httpx.HTTPError, ValueError):
            return
        with self._lock:
            if self._busy is not None or self._snap.container_id != snap.container_id:
                return
            if verdict.stalled and self._snap.state is S.READY:
                d = self._stall_diagnosis(verdict.running, verdict.idle_s)
                self._apply(sm.Stalled(d, f"stalled: {int(verdict.running)} request(s) running, no token for "
                                          f"{verdict.idle_s:.0f} s"))
                restart = self._restart_on_stall()
            elif not verdict.stalled and self._snap.state is S.STALLED:
                self._apply(sm.Unstalled("tokens are moving again"))
                return
            else:
                return
        if restart and snap.profile_id:
            self._restart_stalled(snap.profile_id)

    def _stall_diagnosis(self, running: float, idle_s: float) -> Diagnosis:
        tail = tuple(ln.text for ln in self.logs.recent(5))
        return Diagnosis(
            "stalled", "stalled: requests running, no tokens",
            f"{int(running)} request(s) are running but vllm:generation_tokens_total (and prompt tokens) have not moved "
            f"for {idle_s:.0f} s (limit {self._stall_after():.0f} s) while /health still answers 200 — the engine is "
            "wedged (a known vLLM failure mode).",
            "Restart the engine on the same profile (Engine tab: Stop, then Start; or set engine.restart_on_stall = "
            "true in the recipe to do it automatically). Keep the Logs view: the last lines before the stall are the "
            "evidence to report.",
            (f"running requests: {int(running)}", f"seconds since the last token: {idle_s:.0f}") + tail,
        )

    def _stall_after(self) -> float:
        v = self.options.stall_after_s
        return float(v if v is not None else self.recipe.engine.stall_after_s)

    def _restart_on_stall(self) -> bool:
        v = self.options.restart_on_stall
        return bool(v if v is not None else self.recipe.engine.restart_on_stall)


def _started_epoch(started_at: str) -> float:
    """Docker/ProcessRuntime ISO start time -> epoch (names the run's log files; same run, same files)."""
    try:
        return float(calendar.timegm(time.strptime(started_at[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return time.time()


def close_stream(stream: Any) -> None:
    try:
        stream.close()
    except Exception:  # already closed
        pass
