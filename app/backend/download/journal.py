"""Download journal (atomic JSON in the destination) and the destination lock.

Layout under `<dest>/.moet-panel/downloads/`:
  <artifact>.json        journal: pinned commit, parts (status, done segments), files extracted
  staging/<artifact>/    part files (`<name>` while fetching/verified)
  .lock                  fcntl lock held while a download runs on this destination
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.backend.download.types import ArtifactPlan, ArtifactState, LockedError, PartState, SpaceError
from app.backend.files.atomic import LockBusy, PidLock, atomic_write
from app.backend.config.hf_token import redact

JOURNAL_VERSION = 1  # states are stored as their enum values, the same strings as before the enums
RESERVE_BYTES = 256 * 1024


def downloads_dir(dest: Path) -> Path:
    return dest / ".moet-panel" / "downloads"


def staging_dir(dest: Path, artifact: str) -> Path:
    return downloads_dir(dest) / "staging" / artifact


@dataclass
class PartRecord:
    name: str
    size: int
    sha256: str
    status: PartState = PartState.PENDING
    segments_done: list[int] = field(default_factory=list)
    corrupt_count: int = 0


@dataclass
class ArtifactJournal:
    artifact: str
    repo: str
    commit: str
    endpoint: str
    segment_size: int
    parts: list[PartRecord]
    files_done: dict[str, int] = field(default_factory=dict)  # member name -> size, durable on disk
    extraction_started: bool = False
    state: ArtifactState = ArtifactState.QUEUED
    reason: str = ""
    version: int = JOURNAL_VERSION
    updated: float = 0.0

    def matches(self, plan: ArtifactPlan, repo: str) -> bool:
        """Same repo and exactly the same parts (names and sha256): the journal still applies."""
        ours = [(p.name, p.size, p.sha256) for p in self.parts]
        theirs = [(p.name, p.size, p.sha256) for p in plan.parts]
        return self.repo == repo and ours == theirs


class JournalStore:
    """Loads/saves journals atomically (tmp + fsync + rename); save() is thread-safe."""

    def __init__(self, dest: Path) -> None:
        self.dir = downloads_dir(dest)
        self._lock = threading.Lock()

    def path(self, artifact: str) -> Path:
        return self.dir / f"{artifact}.json"

    def load(self, artifact: str) -> ArtifactJournal | None:
        try:
            raw = json.loads(self.path(artifact).read_text())
        except (OSError, ValueError):
            return None
        if raw.get("version") != JOURNAL_VERSION:
            return None
        try:
            raw["parts"] = [PartRecord(**{**p, "status": PartState.parse(p.get("status"))}) for p in raw["parts"]]
            raw["state"] = ArtifactState.parse(raw.get("state"))
            return ArtifactJournal(**raw)
        except (TypeError, KeyError, AttributeError):  # a damaged journal: start over, never crash on it
            return None

    def fresh(self, plan: ArtifactPlan, repo: str, commit: str, endpoint: str, segment_size: int) -> ArtifactJournal:
        parts = [PartRecord(p.name, p.size, p.sha256) for p in plan.parts]
        return ArtifactJournal(plan.id, repo, commit, endpoint, segment_size, parts)

    def ensure_reserve(self) -> None:
        """A small ballast file, deleted on ENOSPC so the journal can still record "paused"."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / ".reserve"
        if not path.exists() or path.stat().st_size < RESERVE_BYTES:
            try:
                with open(path, "wb") as f:
                    os.posix_fallocate(f.fileno(), 0, RESERVE_BYTES)
            except OSError:
                path.unlink(missing_ok=True)

    def save(self, j: ArtifactJournal) -> None:
        try:
            self._save(j)
        except SpaceError:
            reserve = self.dir / ".reserve"
            if not reserve.exists():
                raise
            reserve.unlink()
            self._save(j)

    def _save(self, j: ArtifactJournal) -> None:
        with self._lock:
            self.dir.mkdir(parents=True, exist_ok=True)
            j.updated = time.time()
            j.reason = redact(j.reason)
            data = json.dumps(asdict(j), indent=1).encode()
            try:
                atomic_write(self.path(j.artifact), data)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # the previous journal stays intact
                    raise SpaceError(f"disk full while saving the download journal in {self.dir}; "
                                     "free some space, then Resume") from None
                raise

    def remove(self, artifact: str) -> None:
        self.path(artifact).unlink(missing_ok=True)


class DestLock:
    """One download per destination: a second panel/CLI gets a clear LockedError."""

    def __init__(self, dest: Path) -> None:
        self.path = downloads_dir(dest) / ".lock"
        self._lock = PidLock(self.path)

    def acquire(self) -> "DestLock":
        try:
            self._lock.acquire()
        except LockBusy as busy:
            raise LockedError(f"another moet-panel download (pid {busy.holder or '?'}) is already using "
                              f"{self.path.parents[2]}; wait for it to finish or pause it there, then retry") from None
        return self

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> "DestLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def clean_partial(dest: Path, artifacts: list[str]) -> int:
    """Remove staging data, journals of unfinished artifacts and `*.moet-partial` files. Returns bytes freed.

    Completed artifacts (journal state "done") keep their journal and extracted tree.
    """
    store = JournalStore(dest)
    freed = 0
    for art in artifacts:
        staging = staging_dir(dest, art)
        if staging.exists():
            freed += sum(f.stat().st_size for f in staging.rglob("*") if f.is_file())
            shutil.rmtree(staging, ignore_errors=True)
        j = store.load(art)
        if j is not None and j.state != ArtifactState.DONE:
            store.remove(art)
    for f in dest.rglob("*.moet-partial") if dest.exists() else []:
        try:
            freed += f.stat().st_size
            f.unlink()
        except OSError:
            pass
    return freed


def artifact_status(data_dir: Path, art_id: str) -> str | None:
    """The download journal's word on one artifact (read-only): "complete", a partial state with what to do,
    or None when no download was ever journaled here (preflight then looks at the directory)."""
    j = JournalStore(data_dir).load(art_id)
    if j is None:
        return None
    if j.state == "done":
        return "complete"
    if j.extraction_started:
        return f"half-extracted ({len(j.files_done)} files; download {j.state}) — resume the download"
    verified = sum(1 for p in j.parts if p.status != "pending")
    return f"incomplete ({verified}/{len(j.parts)} parts verified; download {j.state}) — resume the download"
