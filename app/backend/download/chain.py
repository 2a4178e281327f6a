"""One artifact's parts as one forward-only stream for the extractor, and how far what it read is verified.

A part is read as its segments land, before its sha256 is known; what is extracted from it lands only once
it verifies (extract.CommitGate; docs/downloads.md, "Decoded as it arrives").
"""

from __future__ import annotations

import io
import mmap
import os
import threading
from typing import TYPE_CHECKING, Protocol

from app.backend.download.fds import owned_fd
from app.backend.download.progress import ProgressBoard
from app.backend.download.segments import PartSlot
from app.backend.download.statemachine import VerifyingPart, WaitingForParts
from app.backend.download.types import ArtifactPlan, Limit, PartState

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

VERIFIED, CONSUMED = PartState.VERIFIED, PartState.CONSUMED


class PartLost(Exception):
    """A part the extractor had read ahead into failed sha256: what was decoded since the start is void."""

    def __init__(self, part: str) -> None:
        super().__init__(part)
        self.part = part


class ChainSource(Protocol):
    """What a PartChain needs of its artifact's run (job.ArtifactRun)."""

    plan: ArtifactPlan
    board: ProgressBoard
    slots: list[PartSlot]
    slots_changed: threading.Condition

    def wait_readable(self, chain: PartChain, idx: int, off: int) -> int: ...

    def wait_change(self, phase: VerifyingPart | WaitingForParts, limit: Limit) -> None: ...

    def consumed(self, idx: int) -> None: ...


class PartChain(io.RawIOBase):
    """The parts as one stream, each read as its segments arrive, and the extraction's CommitGate.

    Each read maps just the range it hands out (`map_range`) through an fd of its own, closed before it
    returns: the decompressor reads the page cache in place, without a copy, and the mapping goes when it
    drops the view. The chain keeps no fd (docs/downloads.md, "File descriptors"). The decoding thread
    reads; the tar writer asks `verified`. `at` and `read_gen` are the run's to change, under its
    `slots_changed`.
    """

    def __init__(self, run: ChainSource) -> None:
        self.run, self.idx, self.off = run, 0, 0
        self.at = -1  # the part wait_readable last announced as the one the extractor waits for
        self.pos = 0  # input bytes read, over all parts
        self.read_gen: list[int] = []  # per part read so far: its generation when it was read
        self.verified_parts = self.verified_bytes = self.consumed_upto = 0
        self.cancelled = False  # the extraction ended: a read waiting for input raises Stopped (under slots_changed)

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> memoryview | bytes:
        run = self.run
        while self.idx < len(run.slots):
            s = run.slots[self.idx]
            if self.off < s.info.size:
                end = run.wait_readable(self, self.idx, self.off)
                n = end - self.off if size < 0 else min(size, end - self.off)
                # an fd for this read alone: the decoding thread's, closed before it returns; the mapping
                # stays valid without it (fds.py; docs/downloads.md, "File descriptors")
                with owned_fd(s.path, os.O_RDONLY) as fd:
                    view = map_range(fd, self.off, self.off + n)
                self.off += n
                self.pos += n
                run.board.add_decoded(run.plan.id, n)
                return view
            self.idx, self.off = self.idx + 1, 0
            self.verified()  # parts read and verified are consumed (they may be evicted)
        return b""

    def readinto(self, b: WriteableBuffer) -> int:
        view = memoryview(b)
        data = self.read(len(view))
        view[:len(data)] = data
        return len(data)

    def cancel(self) -> None:
        """The extraction ended early: a read waiting for input gives up (extract.ExtractHooks.cancel_source)."""
        with self.run.slots_changed:
            self.cancelled = True
            self.run.slots_changed.notify_all()

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
                    raise PartLost(run.slots[i].info.name)
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
        """Until all read so far is verified; raises PartLost if some of it failed."""
        self.wait_verified(self.pos)


def map_range(fd: int, start: int, end: int) -> memoryview:
    """The file's bytes [start, end) mapped read-only, in place: the mapping lives as long as the view
    (a mapping starts on a page boundary)."""
    base = start - start % mmap.ALLOCATIONGRANULARITY
    mm = mmap.mmap(fd, end - base, offset=base, access=mmap.ACCESS_READ)
    return memoryview(mm)[start - base:]
