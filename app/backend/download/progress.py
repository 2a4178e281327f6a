"""Thread-safe progress counters with a moving-average rate, ETA and an honest "stalled" flag."""

from __future__ import annotations

import copy
import threading
import time
from collections import deque

from app.backend.download.types import ArtifactProgress, ArtifactState, DiskPicture, DownloadEvent

RATE_WINDOW_S = 5.0
STALL_AFTER_S = 3.0


class ProgressBoard:
    """Counters per artifact. Writers call add_*/set_*; readers call snapshot() (a deep copy)."""

    def __init__(self, clock=time.monotonic, events_max: int = 200) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._arts: dict[str, ArtifactProgress] = {}
        self._samples: dict[str, deque[tuple[float, int]]] = {}
        self._last_byte: dict[str, float] = {}
        self._in_flight: dict[str, int] = {}
        self.events: deque[DownloadEvent] = deque(maxlen=events_max)
        self._disk: DiskPicture | None = None

    def set_disk(self, disk: DiskPicture) -> None:
        with self._lock:
            self._disk = disk

    def disk(self) -> DiskPicture | None:
        with self._lock:
            return self._disk

    def register(self, art: ArtifactProgress) -> None:
        with self._lock:
            self._arts[art.id] = art
            self._samples[art.id] = deque()
            self._last_byte[art.id] = self._clock()
            self._in_flight[art.id] = 0

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._arts)

    def update(self, art_id: str, **fields: object) -> None:
        with self._lock:
            a = self._arts[art_id]
            for k, v in fields.items():
                setattr(a, k, v)

    def add(self, art_id: str, **deltas: int) -> None:
        with self._lock:
            a = self._arts[art_id]
            for k, v in deltas.items():
                setattr(a, k, getattr(a, k) + v)
            if deltas.get("wire_bytes"):
                self._last_byte[art_id] = self._clock()

    def flight(self, art_id: str, delta: int) -> None:
        """Count requests in flight: "stalled" means requests are open and nothing arrives."""
        with self._lock:
            if self._in_flight[art_id] == 0 and delta > 0:
                self._last_byte[art_id] = self._clock()
            self._in_flight[art_id] += delta

    def snapshot_field(self, art_id: str, name: str) -> object:
        with self._lock:
            return getattr(self._arts[art_id], name)

    def state(self, art_id: str) -> ArtifactState:
        with self._lock:
            return self._arts[art_id].state

    def event(self, ev: DownloadEvent) -> None:
        with self._lock:
            self.events.append(ev)

    def snapshot(self) -> list[ArtifactProgress]:
        now = self._clock()
        with self._lock:
            out = []
            for art_id, a in self._arts.items():
                samples = self._samples[art_id]
                samples.append((now, a.wire_bytes))
                while len(samples) > 2 and now - samples[0][0] > RATE_WINDOW_S:
                    samples.popleft()
                t0, b0 = samples[0]
                a.rate_bps = (a.wire_bytes - b0) / (now - t0) if now - t0 > 0.2 else a.rate_bps
                active = a.state in (ArtifactState.DOWNLOADING, ArtifactState.VERIFYING, ArtifactState.EXTRACTING)
                a.stalled = (active and self._in_flight[art_id] > 0
                             and now - self._last_byte[art_id] >= STALL_AFTER_S)
                if a.stalled or a.state in (ArtifactState.DONE, ArtifactState.FAILED, ArtifactState.PAUSED):
                    a.rate_bps = 0.0
                left = max(a.total_bytes - a.fetched_bytes, 0)
                a.eta_s = (left / a.rate_bps) if a.rate_bps > 1 and left else (0.0 if not left else None)
                out.append(copy.copy(a))
            return out
