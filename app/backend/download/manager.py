"""`state.downloads`: the panel's download service (one background run at a time).

The UI calls start/pause/resume/cancel/clean and reads `snapshot()` (cheap: counters + a cached
listing) on its timer ticks. In demo mode (SIMULATED recipe, no explicit endpoint) a local demo hub
is started on first use and labelled SIMULATED everywhere.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from app.backend import oplog

from app.backend.config import hf_token
from app.backend.jobs import SingleFlight
from app.backend.download.ckpt import CkptCheck, check_ckpt_id
from app.backend.download.config import make_config
from app.backend.download.extract import free_bytes
from app.backend.download.journal import DestLock, JournalStore, clean_partial
from app.backend.download.presence import missing_on_disk
from app.backend.download.plan import Prepared, _existing_parent, prepare
from app.backend.download.progress import ProgressBoard
from app.backend.download.runner import run_download
from app.backend.download.statemachine import restored
from app.backend.recipe.schema import ArtifactSpec
from app.backend.download.types import (
    ArtifactProgress, ArtifactState, DiskPicture, DownloadConfig, DownloadError, DownloadSnapshot, PartState,
    StopSignal, Stopped,
)
from app.backend.contracts import GiB, count_text
from app.backend.config.settings import Settings

if TYPE_CHECKING:
    from app.backend.simhub.demo import DemoHub


CANCELLED = "cancelled; downloaded data is kept (Clean partial data removes it)"
NOT_ON_DISK = "done once, not on disk now"
CKPT_RECHECK_S = 2.0  # the ckpt-id check globs the planescache: at most this often between runs
IDLE_COUNTS_TTL_S = 30.0  # /metrics between runs: the journals are read again at most this often


@dataclass(frozen=True)
class ArtifactCounts:
    """One artifact's download counters for /metrics (docs/metrics.md): memory only, no disk or network."""

    id: str
    state: ArtifactState
    received_bytes: int  # bytes off the wire in this panel process, every run summed (retries included)
    verify_failures: int  # parts that failed sha256 in this panel process
    parts_verified: int  # parts verified now (the journal's count between runs)
    parts_total: int
    size_bytes: int  # compressed, all parts (0 until listed)


@dataclass(frozen=True)
class ArtifactRow:
    """One line of the artifact list, before or between runs."""

    id: str
    contents: str
    parts: int
    compressed: int
    extracted_estimate: int


class DownloadManager:
    def __init__(self, settings: Settings, *, endpoint: str | None = None, repo: str | None = None,
                 revision: str | None = None, connections: int | None = None, **overrides: Any) -> None:
        self.settings = settings
        self._endpoint, self._repo, self._revision = endpoint, repo, revision
        self._connections = connections
        self._overrides = overrides
        self._flight = SingleFlight("downloads")  # the run: one at a time, paused or cancelled by its StopSignal
        self._lock = self._flight.lock  # also guards the demo hub and the lister, as the launch sees them
        self._lister: threading.Thread | None = None
        self._board = ProgressBoard()
        self._rows: list[ArtifactRow] = []
        self._message = ""
        self._error = ""
        self._commit = ""
        self._selection: list[str] | None = None
        self._demo: DemoHub | None = None
        self._ckpt: CkptCheck | None = None
        self._ckpt_at = 0.0
        self._past: dict[str, tuple[int, int]] = {}  # earlier runs' (wire bytes, verify failures), for counters()
        self._idle: tuple[float, list[ArtifactProgress]] | None = None

    # ---- configuration -------------------------------------------------------------------------
    @property
    def simulated(self) -> bool:
        return self.settings.demo

    def _config(self) -> DownloadConfig:
        endpoint = self._endpoint
        if endpoint is None and self.settings.recipe.simulated:
            endpoint = self._demo_endpoint()
        cfg = make_config(self.settings, endpoint=endpoint, repo=self._repo, revision=self._revision,
                          connections=self._connections)
        return replace(cfg, **self._overrides) if self._overrides else cfg

    def _demo_endpoint(self) -> str:
        with self._lock:
            if self._demo is None:
                from app.backend.simhub.demo import start_demo_hub  # demo only

                self._demo = start_demo_hub(self.settings.state_dir / "simhub")
            endpoint: str = self._demo.endpoint
            return endpoint

    @property
    def source(self) -> str:
        ep = self._endpoint or ("local demo hub" if self.settings.recipe.simulated else None)
        cfg_ep = ep or self.settings.recipe.hub.endpoint
        label = "SIMULATED Hub · " if self.simulated else ""
        return f"{label}{self._repo or self.settings.recipe.hub.repo} @ {cfg_ep}"

    # ---- listing -------------------------------------------------------------------------------
    def refresh(self) -> str:
        """List the repo (network): parts and sizes per artifact. Returns a status line."""
        try:
            self._message = self._list()
        except DownloadError as exc:
            self._error = exc.message
            return exc.message
        self._error = ""
        return self._message

    def _list(self) -> str:
        cfg = self._config()
        prepared = prepare(cfg, list(self.settings.recipe.artifacts))
        contents = {a.id: a.contents for a in self.settings.recipe.artifacts}
        self._rows = [ArtifactRow(p.id, contents.get(p.id, ""), len(p.parts), p.compressed, p.extracted_estimate)
                      for p in prepared.plans]
        self._commit = prepared.commit
        return f"listed {sum(r.parts for r in self._rows)} parts at commit {prepared.commit[:12]}"

    def rows(self) -> list[ArtifactRow]:
        return list(self._rows)

    # ---- control -------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._flight.alive()

    def start(self, artifact_ids: list[str] | None = None, who: str = oplog.PAGE) -> str:
        """Start (or resume) in the background. A second click while running changes nothing. `who`: who asked
        (the operator's log: a decision per start, pause, cancel and end, never per byte)."""
        run: list[tuple[list[ArtifactSpec], ProgressBoard]] = []

        def setup(_: StopSignal) -> None:  # under the runner's lock, only when nothing runs
            ids = artifact_ids or self._selection or [a.id for a in self.settings.recipe.artifacts]
            specs = [self.settings.recipe.artifact(i) for i in ids]
            self._selection = ids
            self._retire_board()
            self._board = ProgressBoard()
            self._error = ""
            self._message = "starting…"
            run.append((specs, self._board))

        if not self._flight.launch(lambda stop: self._run(*run[0], stop), setup):
            return "a download is already running"
        oplog.decision("downloads", "start", who=who, artifacts=",".join(self._selection or []), source=self.source)
        return "download started"

    def _run(self, specs: list[ArtifactSpec], board: ProgressBoard, stop: StopSignal) -> None:
        stopped = "paused; Resume continues where it stopped (verified data is kept)"
        ids = ",".join(s.id for s in specs)
        try:
            cfg = self._config()
            prepared = run_download(cfg, specs, board, stop, on_prepared=self._on_prepared)
            self._message = (f"{'the' if len(specs) == 1 else 'all'} {count_text(len(specs), 'artifact')} complete "
                             "and verified")
            oplog.decision("downloads", "complete", who=oplog.PANEL, artifacts=ids)
            del prepared
        except Stopped:
            self._message = CANCELLED if stop.cancelled else stopped
        except DownloadError as exc:
            if stop.is_set():
                self._message = CANCELLED if stop.cancelled else stopped
            else:
                self._error = exc.message
                oplog.decision("downloads", "failed", who=oplog.PANEL, level=30, artifacts=ids, reason=exc.message)
        except Exception as exc:  # never let the thread die silently: a bug, said on the page and in the log
            self._error = hf_token.redact(f"internal error: {type(exc).__name__}: {exc}")
            oplog.caught("downloads", exc, "running a download", level=40, traceback=True, artifacts=ids)
        finally:
            self._ckpt = None  # re-read after any run

    def _on_prepared(self, prepared: Prepared) -> None:
        self._commit = prepared.commit
        contents = {a.id: a.contents for a in self.settings.recipe.artifacts}
        listed = {p.id: ArtifactRow(p.id, contents.get(p.id, ""), len(p.parts), p.compressed, p.extracted_estimate)
                  for p in prepared.plans}
        self._rows = [listed.get(r.id, r) for r in self._rows] + [r for i, r in listed.items()
                                                                  if i not in {x.id for x in self._rows}]
        self._message = f"downloading from commit {prepared.commit[:12]}"

    def _stop_run(self, *, cancel: bool) -> bool:
        return self._flight.stop_and_join(cancel=cancel, timeout=10)

    def pause(self, who: str = oplog.PAGE) -> str:
        if not self._stop_run(cancel=False):
            return "nothing is running"
        oplog.decision("downloads", "pause", who=who, artifacts=",".join(self._selection or []))
        return "paused; verified data is kept"

    def resume(self, who: str = oplog.PAGE) -> str:
        return self.start(self._selection, who=who)

    def cancel(self, who: str = oplog.PAGE) -> str:
        if not self._stop_run(cancel=True):
            return "nothing is running"
        oplog.decision("downloads", "cancel", who=who, artifacts=",".join(self._selection or []))
        self._message = CANCELLED
        return self._message

    def clean(self, who: str = oplog.PAGE) -> str:
        if self.running:
            return "pause or cancel the download before cleaning"
        cfg_dest = self.settings.data_dir
        try:
            with DestLock(cfg_dest):
                freed = clean_partial(cfg_dest, [a.id for a in self.settings.recipe.artifacts])
        except DownloadError as exc:
            return exc.message
        self._retire_board()
        self._board = ProgressBoard()
        self._message = f"partial data removed ({freed / GiB:.2f} GiB freed)"
        oplog.decision("downloads", "clean", who=who, freed_bytes=freed)
        return self._message

    # ---- token -----------------------------------------------------------------------------------
    def save_token(self, token: str, who: str = oplog.PAGE) -> str:
        try:
            path = hf_token.save_token(token)
        except ValueError as exc:
            return str(exc)
        oplog.decision("downloads", "setting_changed", who=who, setting="hf_token", new="saved (0600)")
        return f"token saved (mode 0600) in {path}; it is used for the next download"

    def token_status(self) -> str:
        if hf_token.resolve_token() is None:
            return "no token (fine for public repos; gated/private repos need one)"
        return f"token present ({hf_token.REDACTED})"

    # ---- reading ---------------------------------------------------------------------------------
    def ckpt_check(self) -> CkptCheck:
        # re-read now and then: the pin file can be moved or deleted between runs (issue 29)
        now = time.monotonic()
        if self._ckpt is None or self.running or now - self._ckpt_at > CKPT_RECHECK_S:
            self._ckpt, self._ckpt_at = check_ckpt_id(self.settings), now
        return self._ckpt

    def snapshot(self) -> DownloadSnapshot:
        arts = self._board.snapshot()
        if not arts:
            self._list_once()
            arts = self._idle_rows()
        # bytes on the wire since the panel started, the runs before a Resume included: a new run's board starts
        # at 0 and the row's counter went backwards after Resume (issue 49); the same sum as counters() below
        past = dict(self._past)
        arts = [replace(a, wire_bytes=a.wire_bytes + past[a.id][0]) if a.id in past else a for a in arts]
        message = self._message
        if not self.running:  # the disk, not only the journal (issue 29; docs/downloads.md)
            arts = [self._on_disk(a) for a in arts]
            gone = [a for a in arts if a.reason.startswith(NOT_ON_DISK)]
            if gone:
                message = (f"{count_text(len(gone), 'artifact')} not on disk any more ({', '.join(a.id for a in gone)}): "
                           "press Start (or Resume) to download and extract them again, or put the folder back.")
        overall = self._board.overall(arts)
        disk = self._board.disk()
        idle = self._idle_disk()
        if disk is not None and not self.running:  # keep the finished run's staging peak
            disk = replace(idle, staging_peak=disk.staging_peak)
        return DownloadSnapshot(
            running=self.running, artifacts=arts, message=message, error=self._error,
            endpoint=self._endpoint or "", repo=self._repo or self.settings.recipe.hub.repo, commit=self._commit,
            disk=disk or idle, simulated=self.simulated, rate_bps=overall.rate_bps,
            verified_bps=overall.verified_bps, extracted_bps=overall.extracted_bps, eta_s=overall.eta_s,
            binding=overall.binding)

    def _on_disk(self, a: ArtifactProgress) -> ArtifactProgress:
        """A DONE row whose extracted output is gone reads as queued, saying what is missing and the fix."""
        if a.state is not ArtifactState.DONE:
            return a
        spec = next((s for s in self.settings.recipe.artifacts if s.id == a.id), None)
        gone = missing_on_disk(self.settings.data_dir, a.id, spec.yields) if spec else ""
        if not gone:
            return a
        return replace(a, state=ArtifactState.QUEUED, verified_bytes=0, fetched_bytes=0, parts_verified=0,
                       extracted_files=0, extracted_bytes=0,
                       reason=f"{NOT_ON_DISK}: {gone}. Start downloads and extracts it again "
                              "(or move the folder back).")

    def counters(self) -> list[ArtifactCounts]:
        """Counters for the /metrics scrape: the run's board, else the journals' picture cached for
        IDLE_COUNTS_TTL_S; never the network, never a rate sample (docs/metrics.md)."""
        arts = self._board.counts()
        if not arts:
            now = time.monotonic()
            if self._idle is None or now - self._idle[0] > IDLE_COUNTS_TTL_S:
                self._idle = (now, self._idle_rows())
            arts = self._idle[1]
        past = dict(self._past)
        out = []
        for a in arts:
            wire, failures = past.get(a.id, (0, 0))
            out.append(ArtifactCounts(a.id, a.state, wire + a.wire_bytes, failures + a.verify_failures,
                                      a.parts_verified, a.parts_total, a.total_bytes))
        return out

    def _retire_board(self) -> None:
        """Fold the finished board's counters into the process totals before a new board replaces it."""
        for a in self._board.counts():
            wire, failures = self._past.get(a.id, (0, 0))
            self._past[a.id] = (wire + a.wire_bytes, failures + a.verify_failures)
        self._idle = None

    def _list_once(self) -> None:
        """Before the first Start, list the repo once in the background so rows show the listed sizes.

        Not in demo mode without an endpoint: there the listing would first build the demo artifact
        (tar | zstd) on every panel start; the rows say "not listed yet" until Start or Check repo.
        """
        demo_hub = self._endpoint is None and self.settings.recipe.simulated
        with self._lock:
            if demo_hub or self._rows or self._lister is not None or self._flight.started:
                return
            self._lister = threading.Thread(target=self._list_quietly, name="downloads-list", daemon=True)
            self._lister.start()

    def _list_quietly(self) -> None:
        try:
            message = self._list()
        except DownloadError as exc:  # not an error of anything the user did yet: say it, keep Start usable
            message = f"could not list the repo yet: {exc.message}"
        if not self._flight.started:  # a Start in the meantime writes its own message
            self._message = message

    def _idle_rows(self) -> list[ArtifactProgress]:
        store = JournalStore(self.settings.data_dir)
        sizes = {r.id: r for r in self._rows}
        out = []
        for a in self.settings.recipe.artifacts:
            j = store.load(a.id)
            status = restored(j.state, j.reason) if j else None  # killed mid-run reads as paused
            state = status.state if status else ArtifactState.QUEUED
            row = sizes.get(a.id)
            total = row.compressed if row else (sum(p.size for p in j.parts) if j else 0)
            verified = sum(p.size for p in j.parts if p.status != PartState.PENDING) if j else 0
            out.append(ArtifactProgress(id=a.id, state=state, reason=status.reason if status else "", total_bytes=total,
                                        verified_bytes=total if state == ArtifactState.DONE else verified,
                                        fetched_bytes=total if state == ArtifactState.DONE else verified,
                                        extracted_files=len(j.files_done) if j else 0,
                                        parts_total=len(j.parts) if j else (row.parts if row else 0),
                                        parts_verified=sum(p.status != PartState.PENDING for p in j.parts) if j else 0,
                                        estimate=int(a.extracted_gib * GiB)))
        return out

    def _idle_disk(self) -> DiskPicture:
        probe = _existing_parent(self.settings.data_dir)
        store = JournalStore(self.settings.data_dir)
        needed = sum(int(a.extracted_gib * GiB) for a in self.settings.recipe.artifacts
                     if not ((j := store.load(a.id)) and j.state == ArtifactState.DONE))
        return DiskPicture(free=free_bytes(probe), needed=needed, staging_budget=0, path=str(probe))

    def close(self) -> None:
        self._flight.stop_and_join(cancel=False, timeout=10)
        if self._demo is not None:
            self._demo.stop()
            self._demo = None
