"""The observer: what Docker says, sent to the reconciler as observations (docs/engine.md, "One truth").

Its own thread (`engine-observer`) re-reads the panel's containers on every kick (a Docker event, both log
streams ended, an operation ended) and every `resync_s`, adopts a running engine it did not start, explains
an exit (from the LOG'S TAIL: a long run's crash evidence is at its end), and runs the supervisor after each
pass. Every Docker call is made here or on an operation's thread, never on the reconciler: each finding is a
fact whose rule (the pure step, decider/step.py) re-checks the decider's state of that moment ("only if the
engine still shows this container"); a boot nobody here gates is watched only when the step says so
(`WatchBoot`: no operation of this process is in flight). It also notes when Docker was unreachable: a clean
stop seen after an outage was the daemon's (a restart stops its containers), not a person's, and is brought
back (docs/engine.md, "Keeps serving").
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from app.backend import oplog
from app.backend.contracts import LIVE_STATES, Diagnosis, EngineState, slots_of
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.runtime.base import BUILD_LABEL
from app.backend.engine.logs.bootlog import BootProgress, BootTracker
from app.backend.engine.logs.diagnosis import cache_miss_warning
from app.backend.engine.logs.exits import STOPPED_OUTSIDE, explain_exit, is_failure
from app.backend.engine.decider.inbox import Close, Inbox, Kick, Message, Reply, Resync, SyncForOp
from app.backend.engine.decider.facts import (BootLogMoved, BootSeen, DockerAway, DockerAwayServing, ExitSeen,
                                              FollowAdopted, OutsideDrain, OutsideDrainEnded, RunningSeen, RunRemoved,
                                              SyncBegan, SyncEnded, WatchBoot)
from app.backend.engine.lifecycle.tickets import expects_pool
from app.backend.engine.runtime.readiness import probe
from app.backend.engine.control.reconciler import Reconciler, join_thread, wait_reply
from app.backend.engine.control.site import Site
from app.backend.engine.errlog import ErrorsOnce
from app.backend.engine.lifecycle.drainnote import DrainNotes
from app.backend.engine.logs.exits import ExitRecords
from app.backend.engine.logs.following import LogFollower
from app.backend.engine.logs.logstore import LogStore
from app.backend.engine.runtime.base import EventStream, Instance, Runtime, RuntimeOpError, RuntimeUnavailable

ADOPT_PROBE_S = 1.0  # adoption's readiness probe: not ready within this -> shown starting, gated by a watch-only op
EXIT_TAIL_LINES = 400  # the exit diagnosis reads the last lines of a run it did not follow (never its first)
OBSERVE_DEADLINE_S = 120.0  # an operation's "read Docker now" (a few 30 s Docker calls at worst)
DOCKER = "reading Docker"
STOPPED_BY_DOCKER = Diagnosis(
    "docker_restarted", "stopped while Docker was unreachable (a daemon restart?)",
    "The engine shut down cleanly, but while the panel could not reach Docker (or its event stream broke): a "
    "Docker daemon restart (a package upgrade) stops its containers. That is not a person's stop.",
    "Nothing to do: the panel brings back what should run as soon as Docker answers again.",
)


class Observer:
    """Reads Docker and posts what it finds; owns its inbox, its Docker view (runs explained, each run last seen
    running, when Docker was last away) and the event pump."""

    def __init__(self, site: Site, rec: Reconciler, follower: LogFollower, logs: LogStore, exit_records: ExitRecords,
                 drain_notes: DrainNotes, errors: ErrorsOnce, closing: threading.Event) -> None:
        self.site, self.options, self.recipe = site, site.options, site.recipe
        self.rec = rec
        self.follower = follower
        self.logs = logs
        self.exit_records = exit_records
        self.drain_notes = drain_notes
        self.errors = errors
        self.closing = closing
        self.last_exit: Instance | None = None  # the exit explained last (its record decides "stopped by reboot")
        self._inbox = Inbox()  # Kick, SyncForOp, Resync, Close
        self._explained: set[str] = set()  # exited containers already explained (never twice)
        self._running_seen: dict[str, float] = {}
        self._docker_away_at = 0.0
        self._stream_lock = threading.Lock()
        self._events_stream: EventStream | None = None  # docker-py's CancellableStream while the pump reads it
        self._after_pass: Callable[[], None] = lambda: None
        self._watch_boot_op: Callable[[Runtime, Instance], None] = lambda rt, inst: None
        self._thread = threading.Thread(target=self._loop, name="engine-observer", daemon=True)
        self._pump = threading.Thread(target=self._events_loop, name="engine-events", daemon=True)

    def start(self, after_pass: Callable[[], None], watch_boot: Callable[[Runtime, Instance], None]) -> None:
        """Run: `after_pass` after each pass over Docker (the supervisor), `watch_boot` to gate a boot nobody here
        gates (a watch-only operation)."""
        self._after_pass, self._watch_boot_op = after_pass, watch_boot
        self._thread.start()

    def start_pump(self) -> None:
        self._pump.start()

    def kick(self) -> None:
        self._inbox.kick()

    def note_exit(self, inst: Instance | None) -> None:
        """An operation explained this exit itself (its boot gate saw it): the observer does not again, and the
        supervisor reads its record ("stopped by the reboot")."""
        self.last_exit = inst
        if inst is not None:
            self._explained.add(inst.id)

    def close(self) -> None:
        self._inbox.put(Close())
        with self._stream_lock:
            stream = self._events_stream
        if stream is not None:
            try:
                stream.close()
            except Exception as exc:  # already closed by the daemon: nothing left to end
                self.errors.caught("closing the Docker event stream", exc, level=logging.DEBUG)

    def join(self, timeout: float) -> None:
        for t in (self._pump, self._thread):
            join_thread(t, timeout)

    def _loop(self) -> None:
        next_sync = time.monotonic() + self.options.resync_s
        while True:
            timeout: float | None = None  # without the watch (reattach=False): an operation's asks only
            if self.options.reattach:
                timeout = max(0.0, next_sync - time.monotonic())
                due = self.rec.decided.restart_due  # when the supervisor's restart is due (decider/step.py)
                if due is not None:
                    timeout = min(timeout, max(0.05, due.when - time.time()))
            msg = self._inbox.get(timeout)
            if isinstance(msg, Close):
                break
            try:
                if msg is None or isinstance(msg, Kick):
                    if self.options.reattach and not self.closing.is_set():
                        self._reconcile()
                        self._follow_outside_drain()
                        self._after_pass()
                        next_sync = time.monotonic() + self.options.resync_s
                else:
                    self._serve(msg)
            except Exception as exc:  # the observer must survive anything; say why once
                self.errors.caught("observing Docker and supervising", exc, traceback=True)
        for left in self._inbox.drain():
            if isinstance(left, (SyncForOp, Resync)):
                left.reply.snap = self.rec.snapshot()
                left.reply.done.set()

    def _follow_outside_drain(self) -> None:
        """Another process drains this engine (a CLI stop or switch, drainnote.py): the snapshot says `draining`
        meanwhile, so this panel's gateway and Chat tab start no new answer on an engine about to stop; the note
        gone (or its writer dead), the snapshot stops saying it. Never while this process runs an operation of
        its own (its drain is its own: the rules drop an outside drain then)."""
        if self.closing.is_set():
            return
        note = self.drain_notes.other()
        snap = self.rec.snapshot()
        if note is not None and snap.state in (EngineState.READY, EngineState.STALLED):
            if (snap.draining, snap.drain_in_flight, snap.drain_deadline) != (True, note.in_flight, note.deadline):
                ev = sm.Draining(True, note.in_flight, note.deadline, note.expected_back_s)
                applied, _ = self.rec.propose(OutsideDrain(snap.container_id, ev))
                if applied and not snap.draining:  # once per outside drain, not per change of its count
                    oplog.decision("engine", "drain_followed", who=oplog.OUTSIDE, pid=note.pid, in_flight=note.in_flight,
                                   note="another process drains this engine: no new answers here meanwhile")
        elif snap.draining:
            done = sm.Draining(False, 0, 0.0, snap.expected_back_s)
            applied, _ = self.rec.propose(OutsideDrainEnded(done))
            if applied:
                oplog.decision("engine", "drain_followed_end", who=oplog.OUTSIDE)

    def _serve(self, msg: Message) -> None:
        """An operation's SyncForOp or a refresh's Resync: read Docker now; errors go back to the asker."""
        if not isinstance(msg, (SyncForOp, Resync)):
            return
        syncing = isinstance(msg, SyncForOp)
        try:
            if syncing:  # the operation asked for Docker's truth: the decider lets it win meanwhile
                self.rec.propose(SyncBegan())
            self._reconcile()
        except Exception as exc:
            msg.reply.error = exc
        finally:
            if syncing:
                self.rec.propose(SyncEnded(), wait=False)
            msg.reply.snap = self.rec.snapshot()
            msg.reply.done.set()

    def _ask_observer(self, msg: SyncForOp | Resync) -> None:
        if threading.current_thread() is self._thread:
            self._reconcile()
            return
        self._inbox.put(msg)
        wait_reply(msg.reply, self._thread, OBSERVE_DEADLINE_S, "the engine observer (reading Docker)")

    def sync_for_op(self) -> None:
        """Inside an operation: read Docker first, so a start/switch acts on the truth."""
        self._ask_observer(SyncForOp(Reply()))

    def resync(self) -> None:
        self._ask_observer(Resync(Reply()))

    def on_boot_progress(self, cid: str, p: BootProgress) -> None:
        """A followed line moved the boot picture; shown while this run boots."""
        ev = sm.BootProgressed(p.phase, p.pool, cache_miss_warning() if p.cache_miss else "")
        # fire and forget: a follower thread never waits for the reconciler
        self.rec.propose(BootLogMoved(cid, ev), wait=False)

    def on_streams_ended(self, cid: str) -> None:
        """Both log streams ended: the engine probably exited; let the observer look at Docker now."""
        if not self.closing.is_set():
            self._inbox.kick()

    def _caught_docker_away(self, exc: BaseException, context: str) -> None:
        self._docker_away_at = time.time()
        self.errors.caught(context, exc)

    def _events_loop(self) -> None:
        while not self.closing.is_set():
            rt = self.site.runtime
            try:
                stream = rt.events(self.site.labels()) if rt is not None else None
                if stream is None:  # no runtime yet, or one without events (process runtime): resync only
                    self.closing.wait(1.0)
                    continue
                with self._stream_lock:
                    self._events_stream = stream
                for _ in stream:  # an observer: it only tells the observer thread to look
                    if self.closing.is_set():
                        break
                    self._inbox.kick()
                if not self.closing.is_set():  # the daemon ended the stream: it went away (a restart stops containers)
                    self._docker_away_at = time.time()
            except Exception as exc:  # daemon restarted / stream cut: the resync covers the gap, retry shortly
                if not self.closing.is_set():
                    self._caught_docker_away(exc, "watching Docker events")
            finally:
                with self._stream_lock:
                    self._events_stream = None
            self.closing.wait(1.0)

    def _reconcile(self) -> None:
        """Make the snapshot say what Docker says (skipped while this process runs a mutating operation, unless
        that operation asked: its SyncForOp, at the start of a start/switch)."""
        if self.rec.writing() or self.closing.is_set():
            return
        rt = self.site.get_runtime()
        if rt is None:
            return
        try:
            mine = self.site.list_mine(rt)
        except (RuntimeUnavailable, RuntimeOpError) as exc:
            self._caught_docker_away(exc, DOCKER)
            snap = self.rec.snapshot()
            if snap.state in (EngineState.READY, EngineState.STALLED) and snap.base_url and \
                    probe(snap.base_url, snap.served_name, read_timeout_s=ADOPT_PROBE_S).health_ok:
                # observed truth: the engine still answers, only Docker is away (a cut socket, a daemon with
                # live-restore): it keeps serving; the next pass looks again
                note = sm.Noted(f"Docker is unreachable; the engine still answers ({exc})", snap.diagnosis)
                self.rec.propose(DockerAwayServing(snap.container_id, note))
                return
            failed = sm.Failed(Diagnosis("docker_unreachable", "Docker daemon unreachable", str(exc),
                                         "Is dockerd running (`systemctl status docker`)? Is DOCKER_HOST right?"),
                               str(exc))
            self.rec.propose(DockerAway(failed))
            return
        if self.errors.recovered(DOCKER):
            oplog.decision("engine", "docker_back", who=oplog.OUTSIDE, note="Docker answers again")
        now = time.time()
        for i in mine:
            if i.running:
                self._running_seen[i.id] = now
        running = sorted((i for i in mine if i.running), key=lambda i: i.started_at)
        if running:
            self._reconcile_running(rt, running)
        else:
            self._reconcile_nothing_runs(rt, mine)

    def _reconcile_running(self, rt: Runtime, running: list[Instance]) -> None:
        snap = self.rec.snapshot()
        inst = running[-1]
        if snap.container_id == inst.id and snap.state in LIVE_STATES | {EngineState.STOPPING}:
            if snap.state is EngineState.STARTING:  # booting: the decider says whether anyone here gates it
                if any(isinstance(c, WatchBoot) for c in self.rec.post(BootSeen(inst.id)).commands):
                    self._watch_boot_op(rt, inst)
            return
        self._adopt(rt, inst, len(running))

    def _reconcile_nothing_runs(self, rt: Runtime, mine: list[Instance]) -> None:
        """Explain the run the snapshot still shows, or (fresh process) the newest exited run."""
        snap = self.rec.snapshot()
        if snap.state in LIVE_STATES or snap.state is EngineState.STOPPING:
            cid = snap.container_id
        elif snap.state is EngineState.FAILED and snap.container_id:
            if not any(i.id == snap.container_id and i.status != "removing" for i in mine):
                gone = sm.Vanished(f"{snap.container_name or 'the engine container'} was removed "
                                   "(the last diagnosis is kept below)", snap.diagnosis)
                # the failed run's container was removed: nothing is there; keep why it failed
                self.rec.propose(RunRemoved(snap.container_id, gone))
            return  # already explained
        else:
            exited = sorted((i for i in mine if not i.running), key=lambda i: i.finished_at or i.started_at)
            if not exited or exited[-1].id in self._explained:
                return
            cid = exited[-1].id
        inst_now = next((i for i in mine if i.id == cid), None)
        self._explain(rt, inst_now, cid)

    def _explain(self, rt: Runtime, inst: Instance | None, cid: str) -> None:
        self._explained.add(cid)
        tracker = BootTracker()
        lines: list[str] = []
        if inst is not None:
            self.follower.drain(0.5)  # Docker ends the streams when the container exits: normally at once
            followed = bool(self.rec.snapshot().container_id == cid and self.logs.recent(1))
            # the LOG'S TAIL: a long-running engine's crash evidence is at its end, never in its first lines
            if followed:
                lines = [ln.text for ln in self.logs.recent(EXIT_TAIL_LINES)]
            else:
                try:
                    lines = [t for _, t in rt.tail_logs(cid, EXIT_TAIL_LINES)]
                except RuntimeUnavailable as exc:  # explained from Docker's record alone, as a run with no log
                    self.errors.caught("reading an exited engine's log tail", exc)
            for text in lines:
                tracker.feed(text)
        d = self.exit_records.read(cid) or explain_exit(inst, lines, cache_miss=tracker.progress.cache_miss)
        if d.reason == STOPPED_OUTSIDE.reason and self._docker_away_at >= self._running_seen.get(cid, float("inf")):
            d = Diagnosis(STOPPED_BY_DOCKER.reason, STOPPED_BY_DOCKER.title, STOPPED_BY_DOCKER.explanation,
                          STOPPED_BY_DOCKER.fix, d.evidence)  # Docker went away after it last ran: the daemon's stop
        self.last_exit = inst
        code = f" (exit code {inst.exit_code})" if inst is not None else ""
        if is_failure(d):  # the failed run's id stays: it is what the badge explains
            ev: sm.Event = sm.Failed(d, f"engine exited{code}: {d.title}", container_id=cid,
                                     container_name=inst.name if inst else "")
        else:
            ev = sm.Vanished(f"engine {d.title}{code}", d)

        shown = self.rec.snapshot().container_id
        if self.rec.propose(ExitSeen(cid, ev))[0]:
            if inst is None or inst.id == shown:
                self.follower.end()
            if d.reason == STOPPED_OUTSIDE.reason or d.reason == STOPPED_BY_DOCKER.reason:
                oplog.decision("engine", "outside_stop_seen", who=oplog.OUTSIDE, container=cid[:12], reason=d.reason)

    def _adopt(self, rt: Runtime, inst: Instance, n_running: int) -> None:
        """Adopt a running panel engine (started by this panel before a restart, another panel or the CLI)."""
        tracker = BootTracker()
        old = rt.read_logs(inst.id, max_lines=20000)  # the boot's phases and pool line are at its start
        for _, text in old:
            tracker.feed(text)
        prog = tracker.progress
        # Probe only an engine whose log says its API is up: one still booting is shown starting at once (the
        # watch-only op gates it), never held back by a probe of a busy new process.
        p = probe(self.site.address(), self.recipe.model.served_name, read_timeout_s=ADOPT_PROBE_S) \
            if prog.api_up else None
        want_pool = expects_pool(inst.env, self.recipe.engine.pool_line)
        ready = p is not None and p.health_ok and p.models_ok and (not want_pool or (slots_of(prog.pool) or 0) > 0)
        adopted = sm.Adopted(inst.profile_id, inst.id, inst.name, self.site.address(), self.recipe.model.served_name,
                             self.recipe.simulated, ready, prog.phase, prog.pool, "", build=inst.labels.get(BUILD_LABEL, ""),
                             image=inst.image)
        commands = self.rec.post(RunningSeen(adopted, n_running)).commands
        follow = [c for c in commands if isinstance(c, FollowAdopted)]
        if not follow:
            return
        first = follow[0].first
        self.follower.begin(rt, inst, from_start=False, tracker=tracker, backlog=old[-300:])
        oplog.decision("engine", "adopt", who=oplog.PANEL if first else oplog.OUTSIDE, container=inst.name,
                       profile=inst.profile_id, ready=ready)
        if any(isinstance(c, WatchBoot) for c in commands):  # (an operation's own read: that operation gates it)
            self._watch_boot_op(rt, inst)
