"""One artifact, end to end: parallel ranged fetch -> sha256 verify -> streaming extraction.

Threads: fetch workers take a connection slot, then the lowest (part, segment) still to fetch; one
verifier hashes each part as its segments arrive; DURABILITY_THREADS fsync extracted files before
the journal calls them done; the caller's thread runs the extractor (extract.py: a zstd thread
decodes, this thread parses tar and writes), which reads the parts in order as they arrive and lands
what it extracted only once the parts it came from are verified.

Several artifacts run at once (runner.py), each with its own threads, decoder and writer. They
share one `ConnectionBudget`: a fetch worker holds one of its N slots per request, and a request
for the part an extractor is waiting on goes ahead of read-ahead requests, so no decoder starves
while another artifact fills its staging. State changes go through `statemachine.transition`
(ProgressBoard.apply) and are journaled by `_apply`, the one place that does both.

Staging budget: parts are admitted (in order) while staged bytes fit the budget, which is recomputed
from free disk. Extracted parts stay in staging while the budget allows (so a crash costs no
re-download: extraction restarts from the artifact's first part, skipping files already complete);
under disk pressure the oldest extracted parts are evicted, and only those would be fetched again.
"""

from __future__ import annotations

import errno
import hashlib
import heapq
import io
import itertools
import mmap
import os
import queue
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from functools import partial
from multiprocessing.context import BaseContext
from multiprocessing.sharedctypes import SynchronizedString
from typing import TYPE_CHECKING, Any, Callable, cast

from app.backend.download import procs
from app.backend.download.extract import ExtractHooks, extract_stream, free_bytes
from app.backend.download.fetch import fetch_range
from app.backend.download.hub import HubClient
from app.backend.download.journal import ArtifactJournal, JournalStore, PartRecord, staging_dir
from app.backend.download.plan import staging_budget
from app.backend.download.progress import ProgressBoard
from app.backend.download.ranged import RangeGetter
from app.backend.download.statemachine import (
    Began, Cancelled, Completed, Event, ExtractingParts, Failed, Paused, VerifyingPart, WaitingForParts,
)
from app.backend.download.types import (
    ArtifactPlan, ArtifactState, CorruptPartError, DownloadConfig, DownloadError, Limit, Notice, PartInfo,
    PartRetry, PartState, PartVerified, SpaceError, StopSignal, Stopped,
)

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

PENDING, VERIFIED, CONSUMED, EVICTED = PartState.PENDING, PartState.VERIFIED, PartState.CONSUMED, PartState.EVICTED

SAVE_EVERY_S = 1.0
BACKGROUND_NICE = 10
HASH_SLICE = 8 << 20
# fsyncs at once: each waits for its file's writeback and a device cache flush; several keep the
# disk's queue full (the extractor already started the writeback, extract.Writeback)
DURABILITY_THREADS = 4


class ConnectionBudget:
    """At most `size` ranged requests at once over every artifact, shared by bytes left to fetch.

    `weights` (compressed bytes each artifact still fetches) give each rank its share of the slots:
    a request of an artifact below its share goes first, since on a saturated link an artifact's
    share of the requests in flight is its share of the link (docs/downloads.md, "Sharing the link";
    measured on 16 cores, capped: 1.10-1.15x as fast as the ranking below alone).
    Among the requests that qualify, urgent ones are served first.

    Urgent = a segment of the part an extractor is waiting for (or an earlier one): while such a
    request waits, read-ahead requests of any artifact do not take a freed slot. Within each kind a
    lower `rank` goes first: the caller ranks artifacts largest first, since the largest one's chain
    bounds the run.

    Shared by artifacts in child processes (procs.py), so it is built on a multiprocessing lock and
    a semaphore of wake-ups, never a multiprocessing Condition: a Condition's notify waits for every
    sleeper to acknowledge, and a process that ended while one of its threads slept in wait() left
    notify hanging for ever (seen in the first version). A wake-up here may be spurious (a waiter
    only looks again). What a process holds is counted per rank (= per artifact), so when one is
    killed the parent gives back its slots and drops its waiting requests (`forget`): left counted,
    they held every lower-ranked request back for ever (seen: the OOM-killer test hung CI).
    """

    TAKE_OVER_S = 5.0
    RESERVE_S = 0.1  # how long a read-ahead request leaves free slots to urgent ones on their way

    def __init__(self, size: int, ctx: BaseContext | None = None, ranks: int = 1,
                 weights: list[int] | None = None) -> None:
        ctx = ctx or procs.context()
        self.size = size
        self._ranks = max(ranks, 1)
        # per rank: the slots it may hold while another artifact under its own share waits
        self._quota = ctx.RawArray("i", shares(size, weights) if weights and len(weights) == self._ranks
                                   else [size] * self._ranks)
        self._lock = ctx.Lock()
        self._wake = ctx.Semaphore(0)
        self._free = ctx.RawValue("i", size)
        # requests waiting, in the order they are served: urgent by rank, then read-ahead by rank
        self._waiting = ctx.RawArray("i", 2 * self._ranks)
        self._sleepers = ctx.RawArray("i", self._ranks)  # per rank: requests asleep on _wake
        self._held = ctx.RawArray("i", self._ranks)  # per rank: slots taken
        self._announced = ctx.RawArray("i", self._ranks)  # per rank: urgent requests holding no slot yet

    def acquire(self, urgent: Callable[[], bool], halt: threading.Event, rank: int = 0) -> bool:
        """Take a slot; False when `halt` was set while waiting.

        `urgent` is asked again while the request waits: a read-ahead request becomes urgent when its
        extractor reaches its part (measured on 16 cores: with the urgency fixed when the wait began,
        two of three artifacts' extractors waited 4.5 s for parts queued behind the third's).
        """
        queue: int | None = None  # where this request is counted in self._waiting
        began = time.monotonic()
        try:
            while True:
                deferring = self.RESERVE_S - (time.monotonic() - began)
                with self._lock:
                    now = rank if urgent() else self._ranks + rank
                    if now != queue:
                        if queue is not None:
                            self._waiting[queue] -= 1
                        self._waiting[now] += 1
                        queue = now
                    if self._may_take(queue, rank, deferring > 0):
                        self._free.value -= 1
                        self._held[rank] += 1
                        return True
                    if halt.is_set():
                        return False
                    self._sleepers[rank] += 1
                self._wake.acquire(timeout=0.2 if deferring <= 0 else min(0.2, deferring + 0.001))
                with self._lock:
                    self._sleepers[rank] -= 1
        finally:
            if queue is not None:
                with self._lock:
                    self._waiting[queue] -= 1

    def _may_take(self, queue: int, rank: int, deferring: bool = False) -> bool:
        """Under the lock: a free slot, and no request served before this one waits. A request of an
        artifact below its share goes before one of an artifact at or above it, whatever their kinds.
        A read-ahead request that has waited less than RESERVE_S also leaves a slot to each announced
        urgent request not asking yet."""
        if self._free.value <= 0:
            return False
        if deferring and queue >= self._ranks and self._free.value <= sum(
                max(self._announced[r] - self._waiting[r], 0) for r in range(self._ranks)):
            return False

        def below(q: int) -> bool:
            r = q % self._ranks
            return bool(self._held[r] < self._quota[r])

        if below(queue):
            return not any(self._waiting[q] and below(q) for q in range(queue))
        return (not any(self._waiting[q] and below(q) for q in range(2 * self._ranks))
                and sum(self._waiting[:queue]) == 0)

    def forget(self, rank: int) -> None:
        """The process of artifact `rank` ended without letting go (kill -9, the OOM killer): give back
        its slots, drop its waiting and sleeping requests, and wake the others to look again."""
        # Every holder lets go of the lock within microseconds: one still held after TAKE_OVER_S was held
        # by the process that died, and is taken over (a multiprocessing Lock has no owner). Long enough
        # that a live holder descheduled on a loaded box is never overtaken.
        self._lock.acquire(timeout=self.TAKE_OVER_S)
        try:
            self._free.value += self._held[rank]
            self._held[rank] = self._sleepers[rank] = self._waiting[rank] = self._waiting[self._ranks + rank] = 0
            self._announced[rank] = 0
        finally:
            self._lock.release()
        self.poke()

    def announce(self, rank: int, urgent: int) -> None:
        """Artifact `rank` has `urgent` segments of the part its extractor waits for that hold no slot:
        queued for a fetch worker, or waiting here. When a run starts, every artifact's workers ask
        for the free slots at once, and a read-ahead request that asks first could take a slot that
        a first part's segment asks for a moment later; the same when an extractor moves on to a part
        still queued (docs/downloads.md, "First parts first")."""
        with self._lock:
            self._announced[rank] = max(urgent, 0)

    @property
    def urgent_waiting(self) -> int:
        """Urgent requests waiting for a slot now."""
        with self._lock:
            return sum(self._waiting[:self._ranks])

    @property
    def waiting(self) -> int:
        """Requests of either kind waiting for a slot now."""
        with self._lock:
            return sum(self._waiting)

    def poke(self) -> None:
        """An extractor moved on to its next part: waiting requests ask `urgent` again."""
        with self._lock:
            sleepers = sum(self._sleepers)
        for _ in range(sleepers):
            self._wake.release()

    def release(self, rank: int = 0) -> None:
        with self._lock:
            self._free.value += 1
            self._held[rank] -= 1
        self.poke()


def shares(size: int, weights: list[int]) -> list[int]:
    """`size` slots split in proportion to `weights` (largest remainders), at least one each."""
    total = sum(weights)
    if total <= 0:
        return [size] * len(weights)
    exact = [size * w / total for w in weights]
    quota = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: exact[i] - quota[i], reverse=True)[:size - sum(quota)]:
        quota[i] += 1
    return [max(q, 1) for q in quota]


class SharedFlag:
    """A stop flag every process of a run sees: set once, polled (threading.Event's is_set/set/wait).

    Not multiprocessing.Event, whose set() runs a Condition's notify (see ConnectionBudget)."""

    POLL_S = 0.02

    def __init__(self, ctx: BaseContext) -> None:
        self._value = ctx.RawValue("b", 0)

    def is_set(self) -> bool:
        return bool(self._value.value)

    def set(self) -> None:
        self._value.value = 1

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._value.value:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.POLL_S, left))
        return True


class RunGroup:
    """What the artifacts running at once share: the connection budget, the disk and a group stop.

    `stop` is set by the user's Pause/Cancel or by a full disk in any artifact (the disk is shared:
    the others pause too, keeping what they verified); a failure of any other kind stops only its
    own artifact. Everything shared is a multiprocessing primitive, so a child process running one
    artifact (procs.py) gets the same group, the first disk-full message included; `user_stop` (the
    user's Pause/Cancel) lives in the parent only, mirrored into `stop` by `watch_user`.
    """

    def __init__(self, connections: int, user_stop: threading.Event, jobs: int = 1, ids: list[str] | None = None,
                 ctx: BaseContext | None = None, to_fetch: list[int] | None = None) -> None:
        ctx = ctx or procs.context()
        self.budget = ConnectionBudget(connections, ctx, ranks=len(ids or []), weights=to_fetch)
        # Each fetch worker holds a libcurl handle and 0.5 MiB of buffers (ranged.py), so artifacts running
        # side by side do not each get `connections` of them: twice their even share, which leaves the
        # budget room to shift slots to the artifact whose extractor waits. One per connection each was
        # 0.96-0.97x as fast on 16 cores: more workers waking for each freed slot slowed the store's
        # decoder (docs/downloads.md, "The end game").
        self.workers_per_artifact = min(connections, max(2, -(-2 * connections // max(jobs, 1))))
        self.user_stop: threading.Event | None = user_stop
        self.stop = SharedFlag(ctx)
        self._space = cast(SynchronizedString, ctx.Array("c", 4096))  # the first disk-full message, for every process's pause reason
        self._cancel = ctx.RawValue("b", 0)
        self._ids = list(ids or [])
        # extracted bytes still to write, per artifact. No lock: each entry has one writer (its artifact, then
        # the panel once that one's process has gone), and a lock a killed process held would be held for ever
        self._remaining = ctx.RawArray("q", max(len(self._ids), 1))
        # 1 once an artifact has every part on disk (one writer each, as above): its connections are free,
        # and the next artifact may start beside its decoder's tail (runner.py, docs/downloads.md, "Overlap")
        self._all_fetched = ctx.RawArray("b", max(len(self._ids), 1))
        self._wake = ctx.Semaphore(0)  # a wake-up for the runner's launcher: a fetch ended, or a run did

    def __getstate__(self) -> dict[str, object]:
        """For a child process: the shared primitives only (the user's stop lives in the parent)."""
        return {**self.__dict__, "user_stop": None}

    def disk_full(self, exc: SpaceError) -> None:
        with self._space.get_lock():
            if not self._space.value:
                self._space.value = exc.message.encode()[: len(self._space) - 1]
        self.stop.set()

    @property
    def space_error(self) -> SpaceError | None:
        with self._space.get_lock():
            message = self._space.value
        return SpaceError(message.decode(errors="replace")) if message else None

    def watch_user(self) -> None:
        """Mirror the user's stop into the group stop (runs in a thread until the group stops)."""
        assert self.user_stop is not None  # the parent's group
        while not self.stop.is_set():
            if self.user_stop.wait(0.2):
                self._cancel.value = int(isinstance(self.user_stop, StopSignal) and self.user_stop.cancelled)
                self.stop.set()

    def rank(self, art_id: str) -> int:
        """An artifact's priority for connections: its place in the run order (largest first)."""
        return self._ids.index(art_id) if art_id in self._ids else max(len(self._ids) - 1, 0)

    def set_remaining(self, art_id: str, remaining: int) -> None:
        """Extracted bytes an artifact still has to write (0 once it has ended)."""
        if art_id not in self._ids:  # an artifact the group was not told of (tests build bare groups)
            return
        self._remaining[self._ids.index(art_id)] = remaining

    def fetched_all(self, art_id: str) -> None:
        """An artifact has every part on disk: the next one may start beside it (runner.py)."""
        if art_id in self._ids and not self._all_fetched[self._ids.index(art_id)]:
            self._all_fetched[self._ids.index(art_id)] = 1
            self.wake()

    def has_fetched_all(self, art_id: str) -> bool:
        return art_id in self._ids and bool(self._all_fetched[self._ids.index(art_id)])

    def wake(self) -> None:
        self._wake.release()

    def wait_wake(self, timeout: float) -> None:
        """Until fetched_all / wake, or `timeout` (the caller checks its condition again either way)."""
        self._wake.acquire(timeout=timeout)

    def remaining(self) -> tuple[int, int]:
        """(extracted bytes still to write by every running artifact, how many are running)."""
        running = [r for r in self._remaining[:] if r > 0]
        return sum(running), max(len(running), 1)

    @property
    def cancelled(self) -> bool:
        return bool(self._cancel.value) or (isinstance(self.user_stop, StopSignal) and self.user_stop.cancelled)


class SegmentQueue:
    """The byte ranges an artifact still has to fetch, lowest (part, offset) first.

    A fetch worker takes a connection slot first and only then the lowest segment: parts then
    complete in order, the one the extractor waits for first. When each worker held a segment while
    it waited for a slot, the budget's wake-ups handed freed slots to whichever waiter came first,
    and a later part's segments often went before the rest of the next one (seen on 16 cores:
    the store's extractor waited ~1 s for its second part while 500 MiB of later parts came in;
    docs/downloads.md, "In order").

    The end game: once every part still to fetch is queued (`last`) and fewer bytes are queued than a
    segment for each of the run's `connections`, a worker takes only a piece of its segment, the bytes
    queued split evenly over the connections (at least a quarter of a segment), and leaves the rest
    queued first. Whole segments ended up to a segment's time apart, so the link ran below its rate
    while the last ones drained (measured on 16 cores, capped + link: 0.13-0.32 s of the link lost at
    the end; docs/downloads.md, "The end game"). A segment is still what is journaled and hashed: it
    is done once all its pieces are.
    """

    def __init__(self, connections: int, segment_size: int) -> None:
        self._heap: list[tuple[int, int, int, int, _Slot]] = []  # (part, start, seq, end, slot)
        self._seq = itertools.count()  # ties (a range queued again) keep their order, never compare slots
        self._ready = threading.Condition()
        self._queued = 0  # bytes in the heap
        self._connections = max(connections, 1)
        self._piece_min = max(segment_size // 4, 1)
        self.last = False  # every part still to fetch is queued: no more bytes are on their way in

    def put(self, s: _Slot, start: int, end: int) -> None:
        with self._ready:
            heapq.heappush(self._heap, (s.idx, start, next(self._seq), end, s))
            self._queued += end - start
            self._ready.notify()

    def wait(self, timeout: float) -> bool:
        """Until a segment is queued (True) or `timeout`."""
        with self._ready:
            return bool(self._heap) or self._ready.wait(timeout) and bool(self._heap)

    def pop(self) -> tuple[_Slot, int, int] | None:
        """The lowest range queued, or its first piece in the end game: (slot, start, end)."""
        with self._ready:
            if not self._heap:
                return None
            idx, start, seq, end, s = heapq.heappop(self._heap)
            piece = max(self._piece_min, self._queued // self._connections)
            if self.last and end - start >= piece + self._piece_min:  # no remainder smaller than a piece
                heapq.heappush(self._heap, (idx, start + piece, seq, end, s))
                end = start + piece
            self._queued -= end - start
            return s, start, end

    def first_part(self) -> int | None:
        """The part of the lowest segment queued (None when none is)."""
        with self._ready:
            return self._heap[0][0] if self._heap else None

    def wake_all(self) -> None:
        with self._ready:
            self._ready.notify_all()


@dataclass
class _Slot:
    idx: int
    info: PartInfo
    rec: PartRecord
    path: Path
    segments: int
    admitted: bool = False
    fd: int | None = None
    sha: Any = None  # sha256 of the part's bytes [0, hashed): the verifier's alone (hashlib has no public type)
    hashed: int = 0
    inflight: dict[int, int] = field(default_factory=dict)  # segment -> its pieces holding a connection now
    unfetched: dict[int, int] = field(default_factory=dict)  # segment -> its bytes queued or in flight
    landed: dict[int, int] = field(default_factory=dict)  # range start -> its bytes on disk (segments not done)
    generation: int = 0  # +1 each time it fails sha256: bytes read from it before are void
    fetched_k: int = 0  # segments [0, fetched_k) are on disk: what the extractor may read ahead of the hash


class ArtifactRun:
    def __init__(self, cfg: DownloadConfig, hub: HubClient, plan: ArtifactPlan, journal: ArtifactJournal,
                 store: JournalStore, board: ProgressBoard, group: RunGroup) -> None:
        self.cfg, self.hub, self.plan, self.journal, self.store, self.board = cfg, hub, plan, journal, store, board
        self.group = group
        self.rank = group.rank(plan.id)
        self.user_stop = group.stop  # the user's Pause/Cancel, or a full disk in any artifact
        self.halt = threading.Event()  # user stop OR a fatal error
        self.fatal: BaseException | None = None
        self.slots_changed = threading.Condition()
        self.journal_lock = threading.RLock()
        self.last_save = 0.0
        self.staging = staging_dir(cfg.dest, plan.id)
        self.segment_size = journal.segment_size
        self.tasks = SegmentQueue(group.budget.size, self.segment_size)
        self.verify_q: queue.Queue[_Slot | None] = queue.Queue()
        self.durable_q: queue.Queue[tuple[str, int, str] | None] = queue.Queue()
        self.next_needed = 0
        self.wants: tuple[int, int] | None = None  # (part, offset) the extractor waits for, while it does
        self.already_extracted = sum(journal.files_done.values())
        self.slots = [self._make_slot(i, p, r) for i, (p, r) in enumerate(zip(plan.parts, journal.parts, strict=True))]

    # ---- setup ---------------------------------------------------------------------------------
    def _make_slot(self, idx: int, info: PartInfo, rec: PartRecord) -> _Slot:
        path = self.staging / info.name
        size = path.stat().st_size if path.exists() else -1
        if rec.status in (VERIFIED, CONSUMED) and size != info.size:
            rec.status, rec.segments_done = PENDING, []  # staged file lost: fetch again
        if rec.status == EVICTED or (rec.status == PENDING and size < 0):
            rec.status, rec.segments_done = PENDING, []
        segments = max(1, -(-info.size // self.segment_size))
        if rec.status in (VERIFIED, CONSUMED):
            # Bytes left by an earlier process are hashed again before use (verify before trust;
            # this also makes fsync of staging parts unnecessary). Extraction restarts at part 0.
            rec.status, rec.segments_done = PENDING, list(range(segments))
        return _Slot(idx, info, rec, path, segments)

    # ---- public --------------------------------------------------------------------------------
    def run(self) -> None:
        self.staging.mkdir(parents=True, exist_ok=True)
        pid = self.plan.id
        if self.user_stop.is_set():  # stopped while waiting for a slot: never started
            self._on_error(self.group.space_error or Stopped())
            raise self.group.space_error or Stopped()
        done_bytes = sum(s.info.size for s in self.slots if s.rec.status == VERIFIED)
        seg_bytes = sum(self._seg_len(s, k) for s in self.slots if s.rec.status == PENDING for k in s.rec.segments_done)
        reused = sum(bool(s.rec.segments_done) or s.rec.status != PENDING for s in self.slots)
        self.board.restore_counts(pid, fetched=done_bytes + seg_bytes, verified=done_bytes,
                                  parts_verified=sum(s.rec.status == VERIFIED for s in self.slots), reused_parts=reused)
        self.group.set_remaining(pid, max(self.plan.extracted_estimate - self.already_extracted, 1))
        resumed = ""
        if reused or self.journal.files_done:
            resumed = (f"resumed: reuses {reused} of {len(self.slots)} parts from the last run"
                       + (f", {len(self.journal.files_done)} files already extracted" if self.journal.files_done else ""))
            self.board.event(Notice(pid, message=resumed))
        self._apply(Began(resumed))
        threads = [threading.Thread(target=self._worker, name=f"fetch-{i}", daemon=True)
                   for i in range(self.group.workers_per_artifact)]
        threads.append(threading.Thread(target=self._verifier, name="verify", daemon=True))
        threads += [threading.Thread(target=self._durability, name=f"fsync-{i}", daemon=True)
                    for i in range(DURABILITY_THREADS)]
        for t in threads:
            t.start()
        watcher = threading.Thread(target=self._watch_user_stop, daemon=True)
        watcher.start()
        try:
            with self.slots_changed:
                for s in self.slots:
                    if s.rec.status == PENDING and len(s.rec.segments_done) == s.segments:
                        self._open(s)
                        s.admitted = True
                        self.verify_q.put(s)
                self._schedule()
            self._tell_if_fetched_all()  # a resumed artifact may have every part staged already
            self._extract()
            self._finish_threads(threads)
            self._raise_if_halted()
            self._complete()
        except BaseException as exc:
            self.halt.set()
            self._finish_threads(threads)
            self._on_error(self.fatal or exc)
            if self.fatal is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise self.fatal from exc
            raise
        finally:
            self.halt.set()
            self.group.set_remaining(pid, 0)
            self.group.budget.announce(self.rank, 0)
            for s in self.slots:
                self._close(s)
            self._save(force=True)

    # ---- state / journal -----------------------------------------------------------------------
    def _apply(self, event: Event) -> None:
        """The state machine's step for this artifact: board (+ its StateChanged event) and journal."""
        before = self.board.state(self.plan.id)
        status = self.board.apply(self.plan.id, event)
        with self.journal_lock:
            self.journal.state, self.journal.reason = status.state, status.reason
        # a move between the three active phases is saved with the next throttled write
        self._save(force=not (before.active and status.state.active))

    def _save(self, force: bool = False) -> None:
        """Throttled journal write. A full disk halts the run (paused) instead of raising here."""
        error = None
        with self.journal_lock:
            now = time.monotonic()
            if force or now - self.last_save >= SAVE_EVERY_S:
                try:
                    self.store.save(self.journal)
                    self.last_save = now
                except SpaceError as exc:
                    error = exc
        if error is not None:  # outside journal_lock: _fail takes slots_changed (lock order: slots_changed, then journal_lock)
            self._fail(error)

    def _fail(self, exc: BaseException) -> None:
        with self.slots_changed:
            if self.fatal is None and not isinstance(exc, Stopped):
                self.fatal = exc
            self.halt.set()
            self.slots_changed.notify_all()

    def _watch_user_stop(self) -> None:
        while not self.halt.is_set():
            if self.user_stop.wait(0.2):
                self.halt.set()
                with self.slots_changed:
                    self.slots_changed.notify_all()

    def _raise_if_halted(self) -> None:
        if self.fatal is not None:
            raise self.fatal
        if self.user_stop.is_set():
            raise Stopped()

    def _on_error(self, exc: BaseException) -> None:
        if isinstance(exc, SpaceError):
            self.group.disk_full(exc)
            self._apply(Paused(exc.message))
        elif isinstance(exc, (Stopped, KeyboardInterrupt)):
            if self.group.space_error is not None:
                self._apply(Paused(f"paused: {self.group.space_error.message}"))
            elif self.group.cancelled:
                self._apply(Cancelled())
            else:
                self._apply(Paused("paused; Resume continues where it stopped"))
        elif isinstance(exc, DownloadError):
            self._apply(Failed(exc.message))
        else:
            self._apply(Failed(f"internal error: {type(exc).__name__}: {exc}"))

    # ---- scheduling ----------------------------------------------------------------------------
    def _seg_len(self, s: _Slot, k: int) -> int:
        return min(self.segment_size, s.info.size - k * self.segment_size)

    def _staged(self) -> int:
        return sum(s.info.size for s in self.slots if s.admitted or s.rec.status in (VERIFIED, CONSUMED))

    def _budget(self) -> int:
        """This artifact's share of the staging disk: what no running artifact's tree will need, split
        evenly between the running artifacts, on top of what it has staged already."""
        extracted_now = self.board.extracted_bytes(self.plan.id)
        remaining = max(self.plan.extracted_estimate - self.already_extracted - extracted_now, 0)
        self.group.set_remaining(self.plan.id, max(remaining, 1))
        remaining_all, running = self.group.remaining()
        free = free_bytes(self.staging)
        on_disk = sum(os.stat(s.path).st_blocks * 512 for s in self.slots if s.path.exists())
        largest = max(p.size for p in self.plan.parts)
        budget = staging_budget(free, on_disk, remaining_all, largest, self.plan.compressed, self.cfg, share=running)
        self.board.set_staging(self.plan.id, used=on_disk, budget=budget, free=free, needed=remaining + largest,
                               path=str(self.cfg.dest))
        return budget

    def _schedule(self) -> None:
        """Admit parts in order while they fit the staging budget (caller holds self.slots_changed)."""
        budget = self._budget()
        staged = self._staged()
        for s in self.slots:
            if s.admitted or s.rec.status != PENDING:
                continue
            must = s.idx <= self.next_needed
            if staged + s.info.size > budget and not must:
                staged -= self._evict(staged + s.info.size - budget)
                if staged + s.info.size > budget:
                    break
            self._open(s)
            s.admitted = True
            staged += s.info.size
            for k in range(s.segments):
                if k not in s.rec.segments_done:
                    self._queue(s, k)
        self.tasks.last = all(s.admitted or s.rec.status != PENDING for s in self.slots)
        self._announce()

    def _queue(self, s: _Slot, k: int) -> None:
        start = k * self.segment_size
        with self.journal_lock:
            s.unfetched[k] = self._seg_len(s, k)
            self._forget_landed(s, k)
        self.tasks.put(s, start, start + self._seg_len(s, k))

    def _forget_landed(self, s: _Slot, k: int) -> None:
        """Segment k is whole on disk, or to be fetched again (caller holds journal_lock)."""
        lo, hi = k * self.segment_size, (k + 1) * self.segment_size
        for start in [a for a in s.landed if lo <= a < hi]:
            del s.landed[start]

    def _announce(self) -> None:
        """Tell the connection budget how many segments of the part the extractor waits for (or an
        earlier one) hold no connection yet, so that read-ahead leaves them the free slots."""
        with self.journal_lock:
            unserved = sum(s.segments - len(s.rec.segments_done) - len(s.inflight) for s in self.slots
                           if s.idx <= self.next_needed and s.admitted and s.rec.status == PENDING)
        self.group.budget.announce(self.rank, unserved)

    def _evict(self, want: int) -> int:
        freed = 0
        for s in self.slots:
            if freed >= want:
                break
            if s.rec.status == CONSUMED:
                s.path.unlink(missing_ok=True)
                s.rec.status, s.rec.segments_done = EVICTED, []
                freed += s.info.size
        if freed:
            self._save(force=True)
        return freed

    def _open(self, s: _Slot) -> None:
        if s.fd is None:
            s.fd = os.open(s.path, os.O_RDWR | os.O_CREAT, 0o644)

    def _close(self, s: _Slot) -> None:
        if s.fd is not None:
            os.close(s.fd)
            s.fd = None

    # ---- fetch workers -------------------------------------------------------------------------
    def _worker(self) -> None:
        _yield_to_extractor()
        getter = RangeGetter(self.cfg.connect_timeout_s, self.cfg.stall_s)
        try:
            self._fetch_tasks(getter)
        finally:
            getter.close()

    def _fetch_tasks(self, getter: RangeGetter) -> None:
        pid = self.plan.id
        while not self.halt.is_set():
            if not self.tasks.wait(0.2):
                continue  # the loop condition sees the halt
            if not self.group.budget.acquire(self._first_is_urgent, self.halt, self.rank):
                return
            task = self.tasks.pop()
            if task is None:  # another worker took the last one meanwhile
                self.group.budget.release(self.rank)
                continue
            s, start, end = task
            k = start // self.segment_size
            assert s.fd is not None  # admitted parts are open until verified
            self._took_slot(s, k, start)
            self.board.flight(pid, +1)
            try:
                fetch_range(self.hub, getter, s.info, start, end, s.fd, self.halt,
                            on_wire=lambda n: self.board.add_wire(pid, n),
                            on_useful=partial(self._landing, s, start),
                            on_retry=partial(self._retrying, s))
            except Stopped:
                return
            except OSError as exc:
                self._fail(_space_or(exc, f"writing staging part {s.info.name}"))
                return
            except BaseException as exc:
                self._fail(exc)
                return
            finally:
                self.board.flight(pid, -1)
                self.group.budget.release(self.rank)
            self._piece_done(s, k, end - start)

    def _took_slot(self, s: _Slot, k: int, start: int) -> None:
        """A piece of segment k is in flight (until _piece_done); one urgent request fewer on its way."""
        with self.journal_lock:
            s.inflight[k] = s.inflight.get(k, 0) + 1
            s.landed[start] = 0
        if self._is_urgent(s):
            self._announce()

    def _landing(self, s: _Slot, start: int, n: int) -> None:
        """n more bytes of the range from `start` are on disk, in order: the extractor may read them now
        rather than once the whole segment is in (docs/downloads.md, "Read as it lands"); it is woken
        only when these are the bytes it waits for."""
        self.board.add_fetched(self.plan.id, n)
        with self.journal_lock:
            got = s.landed[start] = s.landed.get(start, 0) + n
        wants = self.wants
        if wants is not None and wants[0] == s.idx and start <= wants[1] < start + got:
            with self.slots_changed:
                self.slots_changed.notify_all()

    def _piece_done(self, s: _Slot, k: int, n: int) -> None:
        """n bytes of segment k are on disk; the segment is done once all of it is."""
        with self.journal_lock:
            s.inflight[k] -= 1
            if not s.inflight[k]:
                del s.inflight[k]
            s.unfetched[k] -= n
            whole = s.unfetched[k] <= 0
        if whole:
            self._segment_done(s, k)

    def _is_urgent(self, s: _Slot) -> bool:
        """A request for the part the extractor waits for (or an earlier one) goes ahead of read-ahead."""
        return s.idx <= self.next_needed

    def _first_is_urgent(self) -> bool:
        """A waiting worker's request is urgent while the lowest segment queued is (it takes that one)."""
        first = self.tasks.first_part()
        return first is not None and first <= self.next_needed

    def _retrying(self, s: _Slot, why: str) -> None:
        self.board.event(PartRetry(self.plan.id, part=s.info.name, reason=why))

    def _segment_done(self, s: _Slot, k: int) -> None:
        with self.journal_lock:
            self._forget_landed(s, k)
            if k not in s.rec.segments_done:
                s.rec.segments_done.append(k)
            complete = len(s.rec.segments_done) == s.segments
        self._save()
        self.verify_q.put(s)  # the verifier hashes the part's bytes as they arrive, in order
        with self.slots_changed:
            self.slots_changed.notify_all()  # the extractor reads a part as its segments arrive
        if complete:
            self._tell_if_fetched_all()

    def _tell_if_fetched_all(self) -> None:
        """Every part on disk (a part failing sha256 later is fetched again all the same)."""
        with self.journal_lock:
            every = all(s.rec.status != PENDING or len(s.rec.segments_done) == s.segments for s in self.slots)
        if every:
            self.group.fetched_all(self.plan.id)

    # ---- verification --------------------------------------------------------------------------
    def _verifier(self) -> None:
        _yield_to_extractor()
        while not self.halt.is_set():
            try:
                s = self.verify_q.get(timeout=0.2)
            except queue.Empty:
                continue
            if s is None:
                continue  # the loop condition sees the halt
            try:
                self._verify(s)
            except Stopped:
                return
            except BaseException as exc:
                self._fail(_space_or(exc, f"verifying {s.info.name}") if isinstance(exc, OSError) else exc)
                return

    def _verify(self, s: _Slot) -> None:
        """Hash the segments in from the part's start; once every segment is in, compare the sha256.

        Called at each segment's end, so a part's hash is ready when its last segment arrives, not a
        whole part's hashing later: that wait was on the critical path at each artifact's first part
        and, link-bound, its last (docs/downloads.md, "Hashed as it arrives"). Nothing extracted from
        the part lands before the comparison (verify before trust; _PartChain).
        """
        if s.rec.status != PENDING or s.fd is None:
            return  # verified already: a late wake-up
        pid = self.plan.id
        with self.journal_lock:
            done, complete = set(s.rec.segments_done), len(s.rec.segments_done) == s.segments
        end, k = s.hashed, s.hashed // self.segment_size
        while k in done:
            end, k = min((k + 1) * self.segment_size, s.info.size), k + 1
        if end > s.hashed and os.fstat(s.fd).st_size >= end:  # a short file fails the comparison below
            s.sha = s.sha or hashlib.sha256()
            _hash_range(s.sha, s.fd, s.hashed, end, self.halt)
            s.hashed = end
        if not complete:
            return
        h, off = s.sha or hashlib.sha256(), s.hashed
        if off == s.info.size and os.fstat(s.fd).st_size == s.info.size and h.hexdigest() == s.info.sha256:
            with self.slots_changed:
                with self.journal_lock:
                    s.rec.status = VERIFIED
                s.admitted = False
                self._close(s)
                self.slots_changed.notify_all()
            self.board.add_verified(pid, s.info.size)
            self.board.event(PartVerified(pid, part=s.info.name))
            self._save(force=True)
            return
        with self.slots_changed:
            with self.journal_lock:
                s.rec.corrupt_count += 1
                s.rec.segments_done = []
                count = s.rec.corrupt_count
            s.generation, s.fetched_k = s.generation + 1, 0
            self.slots_changed.notify_all()  # an extractor that read ahead into it starts again
        s.sha, s.hashed = None, 0
        self._save(force=True)
        self.board.add_verify_failure(pid)
        got = h.hexdigest() if off == s.info.size else f"{off} of {s.info.size} bytes"
        if count > self.cfg.corrupt_refetches:
            raise CorruptPartError(
                f"part {s.info.name} failed sha256 verification {count} times (expected {s.info.sha256[:16]}…, "
                f"got {got[:16]}…): the server keeps sending corrupt data; nothing from it was extracted. "
                "Try again later or another --endpoint")
        self.board.event(PartRetry(pid, part=s.info.name, reason=f"sha256 mismatch; fetching it again ({count})"))
        self.board.add_fetched(pid, -s.info.size)
        # Not truncated: every segment is written again before it is hashed again, and the extractor
        # may have a range of it mapped (touching a mapping past a file's end is SIGBUS)
        for k in range(s.segments):
            self._queue(s, k)
        self._announce()

    # ---- extraction ----------------------------------------------------------------------------
    def _extract(self) -> None:
        with self.journal_lock:
            self.journal.extraction_started = True
        self._save(force=True)
        dest = self.cfg.dest
        pid = self.plan.id
        hooks = ExtractHooks(
            on_bytes=lambda n: self.board.add_extracted(pid, n),
            on_file=lambda name, size, path: self.durable_q.put((name, size, path)),
            on_skip=lambda name, size: self.board.add_skipped(pid),
            stop=self.halt, reserve_bytes=self.cfg.reserve_bytes,
            on_wait=lambda limit, seconds: self.board.waited(pid, limit, seconds))
        while True:
            chain = hooks.gate = _PartChain(self)
            try:
                try:
                    extract_stream(chain, dest, dict(self.journal.files_done), hooks, describe_pos=chain.describe)
                except (_Lost, Stopped):
                    raise
                except Exception:
                    chain.settle()  # the error may come from bytes read ahead of their hash: trust it once they verify
                    raise
            except _Lost as lost:
                self._restart(chain, lost.part)
                continue
            except Stopped:
                self._raise_if_halted()
                raise
            except OSError as exc:
                raise _space_or(exc, "extracting") from None
            finally:
                chain.close_current()
            break
        self._raise_if_halted()
        if chain.idx < len(self.slots):
            raise DownloadError(f"{self.plan.id}: the archive ended before part {self.slots[chain.idx].info.name}; "
                                "the repo's parts do not form one archive")

    def _restart(self, chain: _PartChain, part: str) -> None:
        """A part the extractor had read ahead into failed sha256: the stream decoded so far is void. Files
        already in place stay (verified, journaled, skipped next time); extraction starts again from the
        first part, which is still staged unless evicted (then fetched again)."""
        with self.slots_changed:
            with self.journal_lock:
                for s in self.slots:
                    if s.rec.status == CONSUMED:
                        s.rec.status = VERIFIED  # untouched since this process verified it
                    elif s.rec.status == EVICTED:
                        s.rec.status, s.rec.segments_done, s.fetched_k = PENDING, [], 0
            self.next_needed = 0
        self.board.add_decoded(self.plan.id, -chain.pos)
        self.board.event(Notice(self.plan.id, message=(
            f"part {part} failed sha256 after the extractor had read ahead into it: nothing from it was kept; "
            "extraction starts again from the first part (files already in place are kept)")))
        self._save(force=True)

    def wait_readable(self, chain: _PartChain, idx: int, off: int) -> int:
        """Block until part idx has bytes past `off` on disk (admitting it first); return where they end.
        A part is read as its segments arrive, in order, before its sha256 is known: what is extracted
        from it lands only once it verifies (extract.CommitGate). Raises on halt, or _Lost when the part
        failed verification after it was read."""
        s = self.slots[idx]
        pid = self.plan.id
        with self.slots_changed:
            if chain.at != idx:  # moved on to this part
                chain.at = self.next_needed = idx
                self.group.budget.poke()
                self.board.set_current_part(pid, s.info.name)
                self._schedule()
            while True:
                if len(chain.read_gen) > idx and chain.read_gen[idx] != s.generation:
                    raise _Lost(s.info.name)
                if s.rec.status in (VERIFIED, CONSUMED):
                    end = s.info.size
                elif not s.admitted:
                    end = 0
                else:
                    end = min(s.fetched_k * self.segment_size, s.info.size)
                    if end <= off:  # only then look for what came in since
                        end = self._landed_end(s)
                if end > off:
                    self.wants = None
                    if len(chain.read_gen) == idx:
                        chain.read_gen.append(s.generation)
                    self._phase(ExtractingParts())
                    return end
                self.wants = (idx, off)
                self.wait_change(WaitingForParts(), Limit.NETWORK)
                self._schedule()

    def _landed_end(self, s: _Slot) -> int:
        """Where the bytes on disk from the part's start end: whole segments, then ranges as they land
        (a segment's pieces in order, the first of them partly in)."""
        seg, size = self.segment_size, s.info.size
        with self.journal_lock:
            done = set(s.rec.segments_done)
            while s.fetched_k in done:
                s.fetched_k += 1
            end = s.fetched_k * seg
            while end < size:
                if end % seg == 0 and end // seg in done:
                    end += seg
                elif (n := s.landed.get(end, 0)) > 0:
                    end += n
                else:
                    break
        return min(end, size)

    def wait_change(self, phase: VerifyingPart | WaitingForParts, limit: Limit) -> None:
        """The extractor waits (caller holds slots_changed): raise on halt; else show what it waits for,
        and wait for a change, at most 0.5 s, counted against `limit`."""
        if self.halt.is_set():
            self._raise_if_halted()
            raise Stopped()
        self._phase(phase)
        started = time.monotonic()
        self.slots_changed.wait(0.5)
        self.board.waited(self.plan.id, limit, time.monotonic() - started)

    def _phase(self, event: VerifyingPart | WaitingForParts | ExtractingParts) -> None:
        """Downloading / verifying / extracting: what the extractor waits for now (caller holds slots_changed)."""
        want = {VerifyingPart: ArtifactState.VERIFYING, WaitingForParts: ArtifactState.DOWNLOADING,
                ExtractingParts: ArtifactState.EXTRACTING}[type(event)]
        if self.board.state(self.plan.id) != want:
            self._apply(event)

    def consumed(self, idx: int) -> None:
        with self.slots_changed:
            with self.journal_lock:
                self.slots[idx].rec.status = CONSUMED
            self._schedule()
        self._save()

    # ---- durability ----------------------------------------------------------------------------
    def _durability(self) -> None:
        while True:
            try:
                item = self.durable_q.get(timeout=0.2)
            except queue.Empty:
                if self.halt.is_set():
                    return
                continue
            if item is None:
                return
            name, size, path = item
            try:
                if not os.path.islink(path):
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            except OSError:
                continue  # not durable -> not recorded; a rerun rewrites it
            with self.journal_lock:
                self.journal.files_done[name] = size
            self.board.add_file(self.plan.id)
            self._save()

    def _finish_threads(self, threads: list[threading.Thread]) -> None:
        for _ in range(DURABILITY_THREADS):
            self.durable_q.put(None)
        for t in threads[-DURABILITY_THREADS:]:
            t.join()  # the durability threads drain their queue first
        self.halt.set()
        # wake the idle fetch workers and the verifier now rather than at their next 0.2 s poll: the
        # end of the artifact that ends last is the end of the run
        self.tasks.wake_all()
        self.verify_q.put(None)
        self.group.budget.poke()
        for t in threads:
            t.join(timeout=self.cfg.stall_s + 5)

    def _complete(self) -> None:
        yields = self.cfg.dest / self.plan.yields
        warning = ""
        if not yields.is_dir():
            msg = f"{self.plan.id} extracted, but it did not produce {yields}/"
            if self.cfg.recipe_repo:
                raise DownloadError(msg + "; the archive does not match the recipe")
            warning = "warning: " + msg
        shutil.rmtree(self.staging, ignore_errors=True)
        with self.journal_lock:
            for s in self.journal.parts:
                s.status, s.segments_done = EVICTED, []
        self.board.set_staging(self.plan.id, used=0, budget=0, free=free_bytes(self.cfg.dest), needed=0,
                               path=str(self.cfg.dest))
        self._apply(Completed(warning))


class _Lost(Exception):
    """A part the extractor had read ahead into failed sha256: what was decoded since the start is void."""

    def __init__(self, part: str) -> None:
        super().__init__(part)
        self.part = part


class _PartChain(io.RawIOBase):
    """One artifact's parts as one forward-only stream, each read as its segments arrive, and the
    extraction's CommitGate: how far what it read is verified.

    The decoder used to wait for each part's sha256 before reading it: on 16 cores the store's
    extractor then waited for a whole part at every start and, link-bound, at every part
    (docs/downloads.md, "Decoded as it arrives"). Each read maps just the range it hands out
    (`map_range`): the decompressor reads the page cache in place, without a copy, and the mapping
    goes when it drops the view. The decoding thread reads; the tar writer asks `verified`.
    """

    def __init__(self, run: ArtifactRun) -> None:
        self.run, self.idx, self.off = run, 0, 0
        self.at = -1  # the part wait_readable last announced as the one the extractor waits for
        self.pos = 0  # input bytes read, over all parts
        self.fd = -1
        self.read_gen: list[int] = []  # per part read so far: its generation when it was read
        self.verified_parts = self.verified_bytes = self.consumed_upto = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> memoryview | bytes:
        run = self.run
        while self.idx < len(run.slots):
            s = run.slots[self.idx]
            if self.off < s.info.size:
                end = run.wait_readable(self, self.idx, self.off)
                if self.fd < 0:
                    self.fd = os.open(s.path, os.O_RDONLY)
                n = end - self.off if size < 0 else min(size, end - self.off)
                view = map_range(self.fd, self.off, self.off + n)
                self.off += n
                self.pos += n
                run.board.add_decoded(run.plan.id, n)
                return view
            self.close_current()
            self.idx, self.off = self.idx + 1, 0
            self.verified()  # parts read and verified are consumed (they may be evicted)
        return b""

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b)
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def close_current(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # a mapping the decompressor still holds stays valid
            self.fd = -1

    def describe(self) -> str:
        if self.idx < len(self.run.slots):
            return f"in part {self.run.slots[self.idx].info.name}"
        return "at the end of the archive"

    # ---- extract.CommitGate ----------------------------------------------------------------------
    def position(self) -> int:
        return self.pos

    def verified(self) -> int:
        run = self.run
        with run.slots_changed:
            while self.verified_parts < len(self.read_gen):
                s = run.slots[self.verified_parts]
                if s.generation != self.read_gen[self.verified_parts] or s.rec.status not in (VERIFIED, CONSUMED):
                    break
                self.verified_bytes += s.info.size
                self.verified_parts += 1
            for i in range(self.verified_parts, len(self.read_gen)):
                if run.slots[i].generation != self.read_gen[i]:
                    raise _Lost(run.slots[i].info.name)
            while self.consumed_upto < min(self.verified_parts, self.idx):
                run.consumed(self.consumed_upto)
                self.consumed_upto += 1
            return self.verified_bytes

    def wait_verified(self, position: int) -> None:
        run = self.run
        with run.slots_changed:
            while self.verified() < position:
                run.wait_change(VerifyingPart(), Limit.HASH)

    def settle(self) -> None:
        """Until all read so far is verified; raises _Lost if some of it failed."""
        self.wait_verified(self.pos)


def map_range(fd: int, start: int, end: int) -> memoryview:
    """The file's bytes [start, end) mapped read-only, in place: the mapping lives as long as the view
    (a mapping starts on a page boundary)."""
    base = start - start % mmap.ALLOCATIONGRANULARITY
    mm = mmap.mmap(fd, end - base, offset=base, access=mmap.ACCESS_READ)
    return memoryview(mm)[start - base:]


def _hash_range(h: Any, fd: int, start: int, end: int, halt: threading.Event) -> None:
    """h.update() with the file's bytes [start, end), read in place from the page cache: one mapping per
    HASH_SLICE, gone before the next, so at most one slice is in RSS (a run of segments may be a whole
    part: mapped at once, three verifiers held 200 MiB more PSS on the 16-core host). A mapping starts
    on a page boundary."""
    for pos in range(start, end, HASH_SLICE):
        if halt.is_set():
            raise Stopped()
        stop = min(pos + HASH_SLICE, end)
        base = pos - pos % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(fd, stop - base, offset=base, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                h.update(view[pos - base:])
            finally:
                view.release()


def _yield_to_extractor() -> None:
    """Lower this thread's CPU priority (Linux nice is per thread).

    The extractor is the critical path (one zstd stream cannot be split across cores); fetch and
    verify threads run ahead of it and only need what it leaves. On a 2-core box they otherwise
    take CPU from decompression while the download is still ahead of it.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (OSError, AttributeError):
        pass  # not Linux, or not allowed: same priority as before


def _space_or(exc: OSError, doing: str) -> BaseException:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return SpaceError(f"disk full while {doing}; free some space, then Resume (verified data is kept)")
    return exc
