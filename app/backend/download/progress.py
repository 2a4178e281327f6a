"""Thread-safe progress per artifact: typed counters, moving-average rates, ETA, the binding limit,
an honest "stalled" flag and the staging disk (now and peak).

The board holds each artifact's state and changes it only through `statemachine.transition`
(`apply`). Rates are averaged over the last RATE_WINDOW_S of snapshots. The binding limit is read
from where the extractor's threads waited in that window (docs/downloads.md, "Progress"):
  - the decompressor waited for a part still on the wire -> network; for one being hashed -> hash;
  - the decompressor waited for a free buffer (the tar writer is behind) -> disk;
  - otherwise the writer waited on the decompressor -> decode.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from app.backend.download.statemachine import ArtifactStatus, Event, transition
from app.backend.download.types import (
    ArtifactProgress, ArtifactState, DiskPicture, DownloadEvent, Limit, StateChanged,
)

RATE_WINDOW_S = 5.0
STALL_AFTER_S = 3.0
UPSTREAM_SHARE = 0.3  # the decoder waited on parts this share of the window: the parts bind, not the decode


@dataclass
class _Sample:
    at: float
    wire: int
    verified: int
    decoded: int
    extracted: int
    waits: dict[Limit, float]


@dataclass
class _Track:
    """Per-artifact bookkeeping beside the public ArtifactProgress."""

    samples: deque[_Sample] = field(default_factory=deque)
    last_byte: float = 0.0
    in_flight: int = 0
    waits: dict[Limit, float] = field(default_factory=lambda: dict.fromkeys(Limit, 0.0))
    staging_budget: int = 0
    needed: int = 0
    free: int = 0
    path: str = ""


@dataclass
class ArtifactMirror:
    """One artifact's whole account on a child process's board, sent to the parent's (procs.py)."""

    progress: ArtifactProgress
    waits: dict[Limit, float]
    in_flight: int
    last_byte: float  # time.monotonic() is one clock for every process of the machine
    staging_budget: int
    needed: int
    free: int
    path: str
    events: list[DownloadEvent]


@dataclass(frozen=True)
class Overall:
    rate_bps: float
    verified_bps: float
    extracted_bps: float
    eta_s: float | None
    binding: Limit | None


class ProgressBoard:
    """Writers call the typed add_*/set_* methods and `apply(event)`; readers call snapshot() (copies)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, events_max: int = 200) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._arts: dict[str, ArtifactProgress] = {}
        self._track: dict[str, _Track] = {}
        self.events: deque[DownloadEvent] = deque(maxlen=events_max)
        self._appended = 0  # events ever appended (the deque drops old ones): export()'s cursor
        self._disk: DiskPicture | None = None
        self._staging_peak = 0

    # ---- registration and state ------------------------------------------------------------------
    def register(self, art: ArtifactProgress) -> None:
        with self._lock:
            self._arts[art.id] = art
            self._track[art.id] = _Track(last_byte=self._clock())

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._arts)

    def apply(self, art_id: str, event: Event) -> ArtifactStatus:
        """The one writer of an artifact's state: transition + the StateChanged event when it moved."""
        with self._lock:
            a = self._arts[art_id]
            old = ArtifactStatus(a.state, a.reason)
            new = transition(old, event)
            a.state, a.reason = new.state, new.reason
            if new != old:
                self._push(StateChanged(art_id, state=new.state, reason=new.reason))
            return new

    def state(self, art_id: str) -> ArtifactState:
        with self._lock:
            return self._arts[art_id].state

    def status(self, art_id: str) -> ArtifactStatus:
        with self._lock:
            a = self._arts[art_id]
            return ArtifactStatus(a.state, a.reason)

    def event(self, ev: DownloadEvent) -> None:
        with self._lock:
            self._push(ev)

    def _push(self, ev: DownloadEvent) -> None:
        self.events.append(ev)
        self._appended += 1

    # ---- across processes (procs.py) ---------------------------------------------------------------
    def export(self, art_id: str, events_from: int) -> tuple[ArtifactMirror, int]:
        """A copy of everything about `art_id`, with the events appended since cursor `events_from`."""
        with self._lock:
            track = self._track[art_id]
            fresh = list(self.events)[-min(self._appended - events_from, len(self.events)):] \
                if self._appended > events_from else []
            mirror = ArtifactMirror(copy.copy(self._arts[art_id]), dict(track.waits), track.in_flight, track.last_byte,
                                    track.staging_budget, track.needed, track.free, track.path, fresh)
            return mirror, self._appended

    def mirror(self, m: ArtifactMirror) -> None:
        """Take over a child process's account of one artifact. Its state moved through `transition`
        on the child's board, the one writer of that artifact's state while the child runs."""
        with self._lock:
            art_id = m.progress.id
            self._arts[art_id] = m.progress
            track = self._track[art_id]
            track.waits, track.in_flight, track.last_byte = m.waits, m.in_flight, m.last_byte
            for ev in m.events:
                self._push(ev)
            if m.path:
                self._set_staging(art_id, m.progress.staging_bytes, m.staging_budget, m.free, m.needed, m.path)

    # ---- counters ----------------------------------------------------------------------------------
    def restore_counts(self, art_id: str, *, fetched: int, verified: int, parts_verified: int,
                       reused_parts: int = 0) -> None:
        """Counters at the start of a run, from what an earlier run left (journal + staging)."""
        with self._lock:
            a = self._arts[art_id]
            a.fetched_bytes, a.verified_bytes, a.parts_verified = fetched, verified, parts_verified
            a.reused_parts = reused_parts

    def add_wire(self, art_id: str, n: int) -> None:
        with self._lock:
            self._arts[art_id].wire_bytes += n
            if n:
                self._track[art_id].last_byte = self._clock()

    def add_fetched(self, art_id: str, n: int) -> None:
        with self._lock:
            self._arts[art_id].fetched_bytes += n

    def add_verified(self, art_id: str, nbytes: int) -> None:
        """One more part passed sha256."""
        with self._lock:
            a = self._arts[art_id]
            a.verified_bytes += nbytes
            a.parts_verified += 1

    def add_verify_failure(self, art_id: str) -> None:
        """One part failed sha256 (it is fetched again; /metrics counts these, docs/metrics.md)."""
        with self._lock:
            self._arts[art_id].verify_failures += 1

    def add_decoded(self, art_id: str, n: int) -> None:
        with self._lock:
            self._arts[art_id].decoded_bytes += n

    def add_extracted(self, art_id: str, n: int) -> None:
        with self._lock:
            self._arts[art_id].extracted_bytes += n

    def add_file(self, art_id: str) -> None:
        with self._lock:
            self._arts[art_id].extracted_files += 1

    def add_skipped(self, art_id: str) -> None:
        with self._lock:
            self._arts[art_id].skipped_files += 1

    def waited(self, art_id: str, limit: Limit, seconds: float) -> None:
        """The extractor's threads waited `seconds` because of `limit` (see the module docstring)."""
        with self._lock:
            self._track[art_id].waits[limit] += seconds

    def waits(self, art_id: str) -> dict[Limit, float]:
        """Seconds the extractor's threads waited so far, by limit (the run's summary)."""
        with self._lock:
            return dict(self._track[art_id].waits)

    def set_current_part(self, art_id: str, name: str) -> None:
        with self._lock:
            self._arts[art_id].current_part = name

    def extracted_bytes(self, art_id: str) -> int:
        with self._lock:
            return self._arts[art_id].extracted_bytes

    def flight(self, art_id: str, delta: int) -> None:
        """Count requests in flight: "stalled" means requests are open and nothing arrives."""
        with self._lock:
            track = self._track[art_id]
            if track.in_flight == 0 and delta > 0:
                track.last_byte = self._clock()
            track.in_flight += delta

    # ---- disk --------------------------------------------------------------------------------------
    def set_disk(self, disk: DiskPicture) -> None:
        """The preflight's picture (before any artifact reports its own staging)."""
        with self._lock:
            self._disk = disk

    def set_staging(self, art_id: str, *, used: int, budget: int, free: int, needed: int, path: str) -> None:
        """One artifact's staging now; the disk picture sums every artifact's and keeps the peak."""
        with self._lock:
            self._set_staging(art_id, used, budget, free, needed, path)

    def _set_staging(self, art_id: str, used: int, budget: int, free: int, needed: int, path: str) -> None:
        self._arts[art_id].staging_bytes = used
        track = self._track[art_id]
        track.staging_budget, track.needed, track.free, track.path = budget, needed, free, path
        total = sum(a.staging_bytes for a in self._arts.values())
        self._staging_peak = max(self._staging_peak, total)
        self._disk = DiskPicture(
            free=free, needed=sum(t.needed for t in self._track.values()),
            staging_budget=sum(t.staging_budget for t in self._track.values()), staging_used=total,
            path=path, staging_peak=self._staging_peak)

    def disk(self) -> DiskPicture | None:
        with self._lock:
            return self._disk

    # ---- reading -----------------------------------------------------------------------------------
    def counts(self) -> list[ArtifactProgress]:
        """Copies of the counters as they stand, without taking a rate sample (the /metrics scrape)."""
        with self._lock:
            return [copy.copy(a) for a in self._arts.values()]

    def snapshot(self) -> list[ArtifactProgress]:
        now = self._clock()
        with self._lock:
            return [self._read(art_id, a, now) for art_id, a in self._arts.items()]

    def overall(self, arts: list[ArtifactProgress]) -> Overall:
        """Totals over a snapshot: summed rates; the ETA and binding limit of the artifact that ends last."""
        rate = sum(a.rate_bps for a in arts)
        verified = sum(a.verified_bps for a in arts)
        extracted = sum(a.extracted_bps for a in arts)
        queued = [a for a in arts if a.state == ArtifactState.QUEUED]
        running = [a for a in arts if a.state.active]
        eta: float | None = None
        binding: Limit | None = None
        if running:
            etas = [a.eta_s for a in running]
            if all(e is not None for e in etas):
                last = max(running, key=lambda a: a.eta_s or 0.0)
                eta, binding = last.eta_s, last.binding
                if queued:  # artifacts waiting for a slot: the rest at the summed decode rate
                    decode_rate = sum(_rate_of(a) for a in running)
                    left = sum(max(a.total_bytes - a.decoded_bytes, 0) for a in queued + running)
                    eta = max(eta or 0.0, left / decode_rate) if decode_rate > 1 else None
            else:
                binding = next((a.binding for a in running if a.binding), None)
        return Overall(rate, verified, extracted, eta, binding)

    def _read(self, art_id: str, a: ArtifactProgress, now: float) -> ArtifactProgress:
        track = self._track[art_id]
        samples = track.samples
        samples.append(_Sample(now, a.wire_bytes, a.verified_bytes, a.decoded_bytes, a.extracted_bytes,
                               dict(track.waits)))
        while len(samples) > 2 and now - samples[0].at > RATE_WINDOW_S:
            samples.popleft()
        first = samples[0]
        dt = now - first.at
        if dt > 0.2:
            a.rate_bps = (a.wire_bytes - first.wire) / dt
            a.verified_bps = (a.verified_bytes - first.verified) / dt
            a.extracted_bps = (a.extracted_bytes - first.extracted) / dt
            decode_bps = (a.decoded_bytes - first.decoded) / dt
            a.binding = _binding(a, {k: track.waits[k] - first.waits[k] for k in Limit}, dt) if a.state.active else None
        else:
            decode_bps = 0.0
        a.stalled = a.state.active and track.in_flight > 0 and now - track.last_byte >= STALL_AFTER_S
        if a.stalled:
            a.binding = Limit.NETWORK
        if a.stalled or not a.state.active:
            a.rate_bps = a.verified_bps = a.extracted_bps = 0.0
        a.eta_s = _eta(a, decode_bps)
        return copy.copy(a)


def _rate_of(a: ArtifactProgress) -> float:
    """Compressed bytes per second through the whole chain (decode when it runs, else the wire)."""
    return a.verified_bps if a.verified_bps > 1 else a.rate_bps


def _eta(a: ArtifactProgress, decode_bps: float) -> float | None:
    """Paused, failed, cancelled or queued rows have no ETA; done is 0. Otherwise the slower of the
    wire (compressed bytes still to fetch) and the extractor (compressed bytes still to decode)."""
    if a.state == ArtifactState.DONE:
        return 0.0
    if not a.state.active:
        return None
    etas = []
    fetch_left = max(a.total_bytes - a.fetched_bytes, 0)
    if fetch_left:
        if a.rate_bps <= 1:
            return None
        etas.append(fetch_left / a.rate_bps)
    decode_left = max(a.total_bytes - a.decoded_bytes, 0)
    if decode_left and decode_bps > 1:
        etas.append(decode_left / decode_bps)
    elif decode_left and not fetch_left:
        return None  # all fetched, the decoder has not reported yet
    return max(etas) if etas else 0.0


def _binding(a: ArtifactProgress, waits: dict[Limit, float], dt: float) -> Limit:
    upstream = waits[Limit.NETWORK] + waits[Limit.HASH]
    if a.decoded_bytes == 0 or upstream > UPSTREAM_SHARE * dt:
        return Limit.HASH if waits[Limit.HASH] > waits[Limit.NETWORK] else Limit.NETWORK
    decode_only = max(waits[Limit.DECODE] - upstream, 0.0)  # the writer's wait, less the decoder's own
    return Limit.DISK if waits[Limit.DISK] > decode_only else Limit.DECODE
