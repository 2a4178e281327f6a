"""Typed state, events, configuration and errors of the download engine."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from app.backend.config.hf_token import redact
# the user's stop (Pause or Cancel; both keep the data): the one every job has, named here too
from app.backend.jobs import StopSignal as StopSignal

MiB = 1 << 20


class ArtifactState(str, Enum):
    """An artifact's state; only `statemachine.transition` moves it (docs/downloads.md, "States")."""

    QUEUED = "queued"
    DOWNLOADING = "downloading"
    PAUSED = "paused"
    VERIFYING = "verifying"
    EXTRACTING = "extracting"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def active(self) -> bool:
        return self in (ArtifactState.DOWNLOADING, ArtifactState.VERIFYING, ArtifactState.EXTRACTING)

    @classmethod
    def parse(cls, value: object) -> "ArtifactState":
        """A journal's state string; anything unknown (an older or damaged journal) reads as queued."""
        try:
            return cls(value)
        except ValueError:
            return cls.QUEUED


class PartState(str, Enum):
    """A staged part's state in the journal: fetched ranges -> sha256 checked -> read by the extractor."""

    PENDING = "pending"  # some or all segments missing, or not hashed yet
    VERIFIED = "verified"  # sha256 matched; the extractor may read it
    CONSUMED = "consumed"  # extracted; kept in staging while the budget allows (a crash refetches nothing)
    EVICTED = "evicted"  # extracted and removed from staging

    @classmethod
    def parse(cls, value: object) -> "PartState":
        try:
            return cls(value)
        except ValueError:
            return cls.PENDING


class Limit(str, Enum):
    """The stage that bounds an artifact's progress right now (see progress.py for how it is read)."""

    NETWORK = "network"
    HASH = "hash"
    DECODE = "decode"
    DISK = "disk"


@dataclass(frozen=True)
class DownloadConfig:
    """Everything one run needs. `token` is held only in memory and never printed (repr hides it)."""

    endpoint: str
    repo: str
    revision: str
    dest: Path
    token: str | None = field(default=None, repr=False)
    connections: int = 8
    segment_size: int = 16 * MiB  # unit of a ranged request and of resume; 8 of them fill the first 128 MiB part
    stall_s: float = 30.0  # watchdog: no byte for this long on a connection -> retry it
    connect_timeout_s: float = 10.0
    attempts_without_progress: int = 8  # per segment; the counter resets whenever bytes arrive
    api_attempts: int = 6
    corrupt_refetches: int = 2  # a part failing sha256 is fetched again this many times
    backoff_base_s: float = 1.0
    backoff_max_s: float = 8.0
    staging_max: int | None = None  # bytes; None = auto (whole compressed artifact if disk allows)
    reserve_bytes: int = 256 * MiB  # never fill the disk to the last byte
    safety_factor: float = 3.0  # extracted ≈ compressed × this, for a repo that is not the recipe's
    recipe_repo: bool = True  # sizes/yields from the recipe apply (False: mirror/other repo)
    simulated: bool = False
    artifact_jobs: int | None = None  # artifacts fetched + extracted at once; None = from the cores (runner.py)


@dataclass(frozen=True)
class PartInfo:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ArtifactPlan:
    id: str
    prefix: str
    yields: str
    parts: tuple[PartInfo, ...]
    extracted_estimate: int  # bytes on disk after extraction: the recipe's figure, else compressed × safety factor

    @property
    def compressed(self) -> int:
        return sum(p.size for p in self.parts)


@dataclass(frozen=True)
class DiskPicture:
    free: int
    needed: int  # peak: remaining extracted size + minimum staging
    staging_budget: int
    staging_used: int = 0
    path: str = ""
    staging_peak: int = 0  # most staging bytes on disk at once during this run, all artifacts together


@dataclass
class ArtifactProgress:
    id: str
    state: ArtifactState = ArtifactState.QUEUED
    reason: str = ""
    total_bytes: int = 0  # compressed, all parts
    wire_bytes: int = 0  # bytes received, retries and discarded bytes included
    fetched_bytes: int = 0  # useful bytes written to staging
    verified_bytes: int = 0
    extracted_bytes: int = 0
    extracted_files: int = 0
    skipped_files: int = 0  # already complete from an earlier run
    parts_total: int = 0
    parts_verified: int = 0
    current_part: str = ""
    decoded_bytes: int = 0  # compressed bytes the decompressor has read (extraction progress, exact)
    rate_bps: float = 0.0  # bytes on the wire per second, moving average
    verified_bps: float = 0.0
    extracted_bps: float = 0.0
    eta_s: float | None = None
    stalled: bool = False
    binding: Limit | None = None  # which stage bounds this artifact now (None: idle)
    estimate: int = 0  # extracted-size estimate
    reused_parts: int = 0  # parts kept from an earlier run (staged or already extracted)
    staging_bytes: int = 0  # this artifact's staging on disk now
    verify_failures: int = 0  # parts that failed sha256 in this run (each is fetched again)


@dataclass
class DownloadSnapshot:
    """What the UI and CLI draw; cheap to copy, safe to read from any thread."""

    running: bool
    artifacts: list[ArtifactProgress]
    message: str = ""
    error: str = ""
    endpoint: str = ""
    repo: str = ""
    commit: str = ""
    disk: DiskPicture | None = None
    simulated: bool = False
    rate_bps: float = 0.0
    verified_bps: float = 0.0
    extracted_bps: float = 0.0
    eta_s: float | None = None
    binding: Limit | None = None  # the binding limit of the artifact that finishes last
    taken_at: float = field(default_factory=time.time)

    @property
    def total_bytes(self) -> int:
        return sum(a.total_bytes for a in self.artifacts)

    @property
    def verified_bytes(self) -> int:
        return sum(a.verified_bytes for a in self.artifacts)


# ---- events ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DownloadEvent:
    artifact: str
    at: float = field(default_factory=time.time, compare=False)


@dataclass(frozen=True)
class StateChanged(DownloadEvent):
    state: ArtifactState = ArtifactState.QUEUED
    reason: str = ""


@dataclass(frozen=True)
class PartVerified(DownloadEvent):
    part: str = ""


@dataclass(frozen=True)
class PartRetry(DownloadEvent):
    part: str = ""
    reason: str = ""


@dataclass(frozen=True)
class Notice(DownloadEvent):
    message: str = ""


# ---- errors ---------------------------------------------------------------------------------------
class DownloadError(Exception):
    """A failure with a one-line, actionable, token-free message."""

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))

    @property
    def message(self) -> str:
        return str(self)


class AuthError(DownloadError):
    """The Hub refused the token (or there is none for a gated repo)."""


class NotFoundError(DownloadError):
    """The repo, revision or a part is not there."""


class SpaceError(DownloadError):
    """Not enough disk: before starting (refused) or mid-run (paused, resumable)."""


class LockedError(DownloadError):
    """Another download holds the destination."""


class CorruptPartError(DownloadError):
    """A part kept failing its sha256."""


class UnsafeArchiveError(DownloadError):
    """The archive holds a member the panel refuses to write."""


class TransientError(Exception):
    """Retryable: 5xx, 429, dropped/short bodies. `retry_after` in seconds when the server said so."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(redact(message))
        self.retry_after = retry_after


class Stopped(Exception):
    """Pause/cancel was requested; everything verified so far is kept."""
