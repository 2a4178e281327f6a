"""One artifact's parts as this run sees them (`PartSlot`), and the byte ranges still to fetch (`SegmentQueue`)."""

from __future__ import annotations

import heapq
import itertools
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from app.backend.download.journal import PartRecord
from app.backend.download.types import PartInfo

if TYPE_CHECKING:
    from _hashlib import HASH  # hashlib's objects have no public type


@dataclass
class PartSlot:
    """A part in this run. Which lock guards what (job.ArtifactRun): `rec` and `landed` are under the run's
    `journal_lock`; `admitted`, `generation` and `fetched_k` under its `slots_changed`; `sha` and
    `hashed` belong to the verifier thread alone. A slot holds no fd: each thread that writes or reads the
    part opens its own for one call (fds.py; docs/downloads.md, "File descriptors")."""

    idx: int
    info: PartInfo
    rec: PartRecord
    path: Path
    segments: int
    admitted: bool = False
    sha: HASH | None = None  # sha256 of the part's bytes [0, hashed)
    hashed: int = 0
    landed: dict[int, int] = field(default_factory=dict)  # segment start -> its bytes on disk (segments not done)
    generation: int = 0  # +1 each time it fails sha256: bytes read from it before are void
    fetched_k: int = 0  # segments [0, fetched_k) are on disk: what the extractor may read ahead of the hash


class SegmentQueue:
    """The byte ranges an artifact still has to fetch, lowest (part, offset) first.

    A fetch worker takes a connection slot first and only then the lowest segment: parts then complete in
    order, the one the extractor waits for first (docs/downloads.md, "In order").

    `_ready` (a Condition) guards `_heap`.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, int, int, PartSlot]] = []  # (part, start, seq, end, slot)
        self._seq = itertools.count()  # ties (a range queued again) keep their order, never compare slots
        self._ready = threading.Condition()

    def put(self, s: PartSlot, start: int, end: int) -> None:
        with self._ready:
            heapq.heappush(self._heap, (s.idx, start, next(self._seq), end, s))
            self._ready.notify()

    def wait(self, timeout: float) -> bool:
        """Until a segment is queued (True) or `timeout`."""
        with self._ready:
            return bool(self._heap) or self._ready.wait(timeout) and bool(self._heap)

    def pop(self) -> tuple[PartSlot, int, int] | None:
        """The lowest range queued: (slot, start, end)."""
        with self._ready:
            if not self._heap:
                return None
            _, start, _, end, s = heapq.heappop(self._heap)
            return s, start, end

    def first_part(self) -> int | None:
        """The part of the lowest segment queued (None when none is)."""
        with self._ready:
            return self._heap[0][0] if self._heap else None

    def wake_all(self) -> None:
        with self._ready:
            self._ready.notify_all()
