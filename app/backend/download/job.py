"""One artifact, end to end: parallel ranged fetch -> sha256 verify -> streaming extraction.

Threads: fetch workers take a connection slot, then the lowest (part, segment) still to fetch
(segments.SegmentQueue); one verifier hashes each part as its segments arrive; DURABILITY_THREADS fsync
extracted files before the journal calls them done; the caller's thread runs the extractor (extract.py:
a zstd thread decodes, this thread parses tar and writes), which reads the parts in order as they arrive
(chain.PartChain) and lands what it extracted only once the parts it came from are verified.

Several artifacts run at once (runner.py), each with its own threads, decoder and writer, sharing one
group (group.RunGroup: the connection budget, the disk, a stop), possibly from child processes
(procs.py). State changes go through `statemachine.transition` (ProgressBoard.apply) and are journaled
by `_apply`, the one place that does both.

Staging budget: parts are admitted (in order) while staged bytes fit the budget, which is recomputed
from free disk. Extracted parts stay in staging while the budget allows (so a crash costs no
re-download: extraction restarts from the artifact's first part, skipping files already complete);
under disk pressure the oldest extracted parts are evicted, and only those would be fetched again.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import mmap
import os
import queue
import shutil
import threading
import time
from functools import partial
from typing import TYPE_CHECKING

from app.backend import oplog
from app.backend.download.chain import PartChain, PartLost
from app.backend.download.extract import ExtractHooks, extract_stream, free_bytes
from app.backend.download.fds import owned_fd
from app.backend.download.fetch import fetch_range
from app.backend.download.group import RunGroup
from app.backend.download.hub import HubClient
from app.backend.download.journal import ArtifactJournal, JournalStore, PartRecord, staging_dir
from app.backend.download.plan import staging_budget
from app.backend.download.progress import ProgressBoard
from app.backend.download.ranged import RangeGetter
from app.backend.download.segments import PartSlot, SegmentQueue
from app.backend.download.statemachine import (
    Began, Cancelled, Completed, Event, ExtractingParts, Failed, Paused, VerifyingPart, WaitingForParts,
)
from app.backend.download.types import (
    ArtifactPlan, ArtifactState, CorruptPartError, DownloadConfig, DownloadError, Limit, Notice, PartInfo,
    PartRetry, PartState, PartVerified, SpaceError, Stopped,
)

if TYPE_CHECKING:
    from _hashlib import HASH  # hashlib's objects have no public type

PENDING, VERIFIED, CONSUMED, EVICTED = PartState.PENDING, PartState.VERIFIED, PartState.CONSUMED, PartState.EVICTED

SAVE_EVERY_S = 1.0
BACKGROUND_NICE = 10
HASH_SLICE = 8 << 20
# fsyncs at once: each waits for its file's writeback and a device cache flush; several keep the
# disk's queue full (the extractor already started the writeback, extract.Writeback)
DURABILITY_THREADS = 4
JOIN_GRACE_S = 5.0  # beyond the stall watchdog, for a thread to stop once the run ends (_finish_threads)


class ArtifactRun:
    """One artifact's threads and state (one instance per artifact, in this process or a child's).

    Two locks, always taken in this order when both are held:
    - `slots_changed` (a Condition; the extractor waits on it): `fatal`, `next_needed`, each slot's
      `admitted`, `generation` and `fetched_k`, and the chain's `at` and `read_gen`. Notified when a
      part is admitted, verified or fails, when bytes the extractor waits for land, and on halt.
    - `journal_lock` (an RLock): `journal` (state, reason, files_done, extraction_started), each slot's
      `rec` (status, segments_done, corrupt_count) and `landed`, and `last_save`.
    `wants` is written under `slots_changed` and read without it by the fetch workers (one tuple, replaced
    whole: a stale read only costs a wake-up). The verifier alone touches a slot's `sha` and `hashed`.
    """

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
        self.tasks = SegmentQueue()
        self.verify_q: queue.Queue[PartSlot | None] = queue.Queue()
        self.durable_q: queue.Queue[tuple[str, int, str] | None] = queue.Queue()
        self.next_needed = 0
        self.wants: tuple[int, int] | None = None  # (part, offset) the extractor waits for, while it does
        self.already_extracted = sum(journal.files_done.values())
        self.threads_finished = False
        self.slots = [self._make_slot(i, p, r) for i, (p, r) in enumerate(zip(plan.parts, journal.parts, strict=True))]

    # ---- setup ---------------------------------------------------------------------------------
    def _make_slot(self, idx: int, info: PartInfo, rec: PartRecord) -> PartSlot:
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
        return PartSlot(idx, info, rec, path, segments)

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
    def _seg_len(self, s: PartSlot, k: int) -> int:
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
            s.admitted = True
            staged += s.info.size
            for k in range(s.segments):
                if k not in s.rec.segments_done:
                    self._queue(s, k)

    def _queue(self, s: PartSlot, k: int) -> None:
        start = k * self.segment_size
        with self.journal_lock:
            s.landed.pop(start, None)
        self.tasks.put(s, start, start + self._seg_len(s, k))

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
            with self.journal_lock:
                s.landed[start] = 0
            held = [True]  # this worker holds a connection slot (not while it waits to retry)
            self.board.flight(pid, +1)
            try:
                # this worker's own fd on the part, for this range alone (fds.py; docs/downloads.md,
                # "File descriptors"): no other thread can close it under the write
                with owned_fd(s.path, os.O_WRONLY | os.O_CREAT) as fd:
                    fetch_range(self.hub, getter, s.info, start, end, fd, self.halt,
                                on_wire=lambda n: self.board.add_wire(pid, n),
                                on_useful=partial(self._landing, s, start),
                                on_retry=partial(self._retrying, s), between=partial(self._between, s, held))
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
                if held[0]:
                    self.group.budget.release(self.rank)
            self._segment_done(s, start // self.segment_size)

    def _between(self, s: PartSlot, held: list[bool], seconds: float) -> None:
        """A retry's wait (backoff, Retry-After) without a connection slot: another artifact's request
        takes it meanwhile. A held slot would starve an artifact that had none yet for as long as this
        part kept failing (a part trickling forever, Retry-After up to 300 s)."""
        self.group.budget.release(self.rank)
        held[0] = False
        if self.halt.wait(seconds) or not self.group.budget.acquire(lambda: s.idx <= self.next_needed,
                                                                     self.halt, self.rank):
            raise Stopped()
        held[0] = True

    def _landing(self, s: PartSlot, start: int, n: int) -> None:
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

    def _first_is_urgent(self) -> bool:
        """A waiting worker's request is urgent while the lowest segment queued is (it takes that one)."""
        first = self.tasks.first_part()
        return first is not None and first <= self.next_needed

    def _retrying(self, s: PartSlot, why: str) -> None:
        self.board.event(PartRetry(self.plan.id, part=s.info.name, reason=why))

    def _segment_done(self, s: PartSlot, k: int) -> None:
        with self.journal_lock:
            s.landed.pop(k * self.segment_size, None)
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

    def _verify(self, s: PartSlot) -> None:
        """Hash the segments in from the part's start; once every segment is in, compare the sha256.

        Called at each segment's end, so a part's hash is ready when its last segment arrives, not a
        whole part's hashing later: that wait was on the critical path at each artifact's first part
        and, link-bound, its last (docs/downloads.md, "Hashed as it arrives"). Nothing extracted from
        the part lands before the comparison (verify before trust; chain.PartChain).
        """
        with self.slots_changed, self.journal_lock:
            if s.rec.status != PENDING or not s.admitted:
                return  # verified already (a late wake-up), or no longer staged
        pid = self.plan.id
        with self.journal_lock:
            done, complete = set(s.rec.segments_done), len(s.rec.segments_done) == s.segments
        end, k = s.hashed, s.hashed // self.segment_size
        while k in done:
            end, k = min((k + 1) * self.segment_size, s.info.size), k + 1
        # the verifier's own fd, for this call alone (fds.py; docs/downloads.md, "File descriptors")
        with owned_fd(s.path, os.O_RDONLY) as fd:
            if end > s.hashed and os.fstat(fd).st_size >= end:  # a short file fails the comparison below
                s.sha = s.sha or hashlib.sha256()
                _hash_range(s.sha, fd, s.hashed, end, self.halt)
                s.hashed = end
            if not complete:
                return
            size_ok = os.fstat(fd).st_size == s.info.size
        h, off = s.sha or hashlib.sha256(), s.hashed
        if off == s.info.size and size_ok and h.hexdigest() == s.info.sha256:
            with self.slots_changed:
                with self.journal_lock:
                    s.rec.status = VERIFIED
                s.admitted = False
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
            chain = hooks.gate = PartChain(self)
            hooks.cancel_source = chain.cancel
            try:
                try:
                    extract_stream(chain, dest, dict(self.journal.files_done), hooks, describe_pos=chain.describe)
                except (PartLost, Stopped):
                    raise
                except Exception:
                    chain.settle()  # the error may come from bytes read ahead of their hash: trust it once they verify
                    raise
            except PartLost as lost:
                self._restart(chain, lost.part)
                continue
            except Stopped:
                self._raise_if_halted()
                raise
            except OSError as exc:
                raise _space_or(exc, "extracting") from None
            break
        self._raise_if_halted()
        if chain.idx < len(self.slots):
            raise DownloadError(f"{self.plan.id}: the archive ended before part {self.slots[chain.idx].info.name}; "
                                "the repo's parts do not form one archive")

    def _restart(self, chain: PartChain, part: str) -> None:
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

    def wait_readable(self, chain: PartChain, idx: int, off: int) -> int:
        """Block until part idx has bytes past `off` on disk (admitting it first); return where they end.
        A part is read as its segments arrive, in order, before its sha256 is known: what is extracted
        from it lands only once it verifies (extract.CommitGate). Raises on halt, or PartLost when the part
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
                if chain.cancelled:
                    raise Stopped()
                if len(chain.read_gen) > idx and chain.read_gen[idx] != s.generation:
                    raise PartLost(s.info.name)
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

    def _landed_end(self, s: PartSlot) -> int:
        """Where the bytes on disk from the part's start end: whole segments, then a segment as it lands."""
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
                    with owned_fd(path, os.O_RDONLY) as fd:
                        os.fsync(fd)
            except OSError:
                continue  # not durable -> not recorded; a rerun rewrites it
            with self.journal_lock:
                self.journal.files_done[name] = size
            self.board.add_file(self.plan.id)
            self._save()

    def _finish_threads(self, threads: list[threading.Thread]) -> None:
        """Stop and join every thread of the run. Each closes its own fds (fds.py), so nothing is closed
        after a join: a thread that does not stop keeps what it has open, and is an error in the operator's
        log (docs/downloads.md, "File descriptors")."""
        if self.threads_finished:
            return
        self.threads_finished = True
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
        started = time.monotonic()
        # a fetch stops within its stall watchdog (ranged.py); the verifier within one HASH_SLICE
        deadline = started + self.cfg.stall_s + JOIN_GRACE_S
        for t in threads:
            t.join(timeout=max(deadline - time.monotonic(), 0))
        stuck = [t.name for t in threads if t.is_alive()]
        if stuck:
            oplog.decision("downloads", "threads-stuck", who=oplog.PANEL, level=logging.ERROR, artifact=self.plan.id,
                           threads=",".join(stuck), waited_s=round(time.monotonic() - started, 1),
                           reason="they did not stop after the run ended; their files stay open until they do")

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


def _hash_range(h: HASH, fd: int, start: int, end: int, halt: threading.Event) -> None:
    """h.update() with the file's bytes [start, end), read in place from the page cache: one mapping per
    HASH_SLICE, gone before the next, so at most one slice is in RSS (a run of segments may be a whole
    part) (docs/downloads.md, "Measurements behind the code"). A mapping starts on a page boundary."""
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
