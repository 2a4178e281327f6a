"""A whole download run: lock the destination, list + pin + preflight, then the artifacts side by side.

Each artifact's chain (fetch -> verify -> decompress -> tar -> write) is its own ArtifactRun with its
own threads; `artifact_jobs` of them run at once, sharing one connection budget (group.RunGroup). The
number comes from the cores (docs/downloads.md, "Three artifacts at once"): one chain keeps about
1.5 cores busy (one zstd frame decodes on one core, tar parsing and hashing beside it), so a 2-core
box runs one artifact at a time, in this process, as before, and 4 or more cores run the largest
artifacts first, together, each in its own child process (procs.py: one GIL per chain). "At a
time" counts the artifacts still fetching: one that has every part on disk lets the next start
beside its decoder's tail (docs/downloads.md, "Overlap").
"""

from __future__ import annotations

import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Callable

from app.backend.download import procs
from app.backend.download.procs import CORES_PER_ARTIFACT, available_cores
from app.backend.download.extract import free_bytes
from app.backend.download.group import RunGroup
from app.backend.download.job import ArtifactRun
from app.backend.download.presence import missing_on_disk
from app.backend.download.journal import ArtifactJournal, DestLock, JournalStore, staging_dir
from app.backend.download.plan import Prepared, prepare
from app.backend.download.progress import ProgressBoard
from app.backend.download.statemachine import FoundComplete
from app.backend.download.types import (
    ArtifactPlan, ArtifactProgress, ArtifactState, DownloadConfig, DownloadError, Notice, PartState, SpaceError,
    Stopped,
)
from app.backend.recipe.schema import ArtifactSpec

def artifact_jobs(cfg: DownloadConfig, artifacts: int) -> int:
    """How many artifacts run at once: cfg.artifact_jobs, else one per CORES_PER_ARTIFACT cores."""
    wanted = cfg.artifact_jobs if cfg.artifact_jobs is not None else available_cores() // CORES_PER_ARTIFACT
    return max(1, min(wanted, artifacts))


def fresh_progress(plan: ArtifactPlan) -> ArtifactProgress:
    return ArtifactProgress(id=plan.id, total_bytes=plan.compressed, parts_total=len(plan.parts),
                            estimate=plan.extracted_estimate)


def register_plans(board: ProgressBoard, prepared: Prepared) -> None:
    for plan in prepared.plans:
        board.register(fresh_progress(plan))


def run_download(cfg: DownloadConfig, specs: list[ArtifactSpec], board: ProgressBoard, stop: threading.Event,
                 on_prepared: Callable[[Prepared], None] | None = None) -> Prepared:
    """Download + verify + extract every artifact in `specs` into cfg.dest.

    Raises DownloadError subclasses (LockedError, SpaceError, AuthError, ...) or Stopped; the per-artifact
    state (done / paused / cancelled / failed with reason) is on the board and in the journal either way.
    A failure in one artifact stops only that one; the others run to their end, and the first failure
    is raised after them (a full disk pauses them all and is raised first).
    """
    jobs = artifact_jobs(cfg, len(specs))
    if jobs > 1:
        procs.start_early()  # the children's imports overlap the listing
    with DestLock(cfg.dest):
        prepared = prepare(cfg, specs, jobs=jobs)
        register_plans(board, prepared)
        board.set_disk(prepared.disk)
        if on_prepared:
            on_prepared(prepared)
        store = JournalStore(cfg.dest)
        store.ensure_reserve()
        todo = [(plan, j) for plan in prepared.plans
                if (j := _journal_for(cfg, prepared, plan, store, board)) is not None]
        if jobs > 1:  # the longest chain first: it bounds the whole run
            todo.sort(key=lambda pj: pj[0].extracted_estimate, reverse=True)
        _run_all(cfg, prepared, todo, store, board, stop, jobs)
    return prepared


def _journal_for(cfg: DownloadConfig, prepared: Prepared, plan: ArtifactPlan, store: JournalStore,
                 board: ProgressBoard) -> ArtifactJournal | None:
    """The journal this run continues, or None when the artifact is already complete."""
    j = store.load(plan.id)
    if j is not None and j.matches(plan, cfg.repo) and j.state == ArtifactState.DONE:
        gone = missing_on_disk(cfg.dest, plan.id, plan.yields)
        if not gone:
            board.restore_counts(plan.id, fetched=plan.compressed, verified=plan.compressed,
                                 parts_verified=len(plan.parts))
            board.apply(plan.id, FoundComplete())
            return None
        # Done once, not on disk now (moved, deleted): its parts were consumed by extraction, so fetch again.
        shutil.rmtree(staging_dir(cfg.dest, plan.id), ignore_errors=True)
        board.event(Notice(plan.id, message=f"{gone}: downloading and extracting it again"))
        j = None
    if j is None or not j.matches(plan, cfg.repo):
        if j is not None:  # the repo changed under us: old staging is useless
            shutil.rmtree(staging_dir(cfg.dest, plan.id), ignore_errors=True)
            board.event(Notice(plan.id, message="the repo's parts changed since the last run; starting over"))
        j = store.fresh(plan, cfg.repo, prepared.commit, cfg.endpoint, cfg.segment_size)
    j.commit, j.endpoint = prepared.commit, cfg.endpoint
    return j


def _run_all(cfg: DownloadConfig, prepared: Prepared, todo: list[tuple[ArtifactPlan, ArtifactJournal]],
             store: JournalStore, board: ProgressBoard, stop: threading.Event, jobs: int) -> None:
    if not todo:  # every artifact is already done (Resume on a finished download): nothing to fetch (issue 42)
        return
    # the connections' shares: bytes each artifact still fetches (docs/downloads.md, "Sharing the link")
    to_fetch = [sum(p.size for p, r in zip(plan.parts, j.parts, strict=True)
                    if r.status in (PartState.PENDING, PartState.EVICTED)) for plan, j in todo]
    group = RunGroup(cfg.connections, stop, jobs, ids=[plan.id for plan, _ in todo], to_fetch=to_fetch)
    watcher = threading.Thread(target=group.watch_user, name="download-stop", daemon=True)
    watcher.start()
    errors: list[BaseException] = []
    try:
        runs: list[Callable[[], None]] = [
            partial(procs.run_in_child, cfg, prepared.hub, plan, j, group, board, fresh_progress(plan)) if jobs > 1
            else ArtifactRun(cfg, prepared.hub, plan, j, store, board, group).run
            for plan, j in todo]
        with ThreadPoolExecutor(max_workers=len(runs), thread_name_prefix="artifact") as pool:
            futures: list[Future[None]] = []
            for (plan, _), run in zip(todo, runs, strict=True):
                _wait_to_start(cfg, plan, [p for p, _ in todo[:len(futures)]], futures, group, jobs)
                futures.append(pool.submit(run))
                futures[-1].add_done_callback(lambda _: group.wake())
            for future in futures:
                exc = future.exception()
                if exc is not None:
                    if isinstance(exc, SpaceError):  # raised in a child: its group.disk_full ran there
                        group.disk_full(exc)
                    errors.append(exc)
    finally:
        group.stop.set()  # ends the watcher
    if errors:
        raise _first(errors, group)


def _wait_to_start(cfg: DownloadConfig, plan: ArtifactPlan, started: list[ArtifactPlan],
                   futures: list[Future[None]], group: RunGroup, jobs: int) -> None:
    """Until `plan` may start: fewer than `jobs` artifacts still fetching, and room on the disk for its
    first part beside what the running ones still extract, when one of them is still running.

    An artifact that has every part on disk leaves its connections idle while its decoder finishes,
    so the next one starts then, not at its end: its first parts are fetched and verified by the
    time the decoder is free, instead of after (docs/downloads.md, "Overlap").
    """
    while not group.stop.is_set():  # a stopped run starts the rest at once: each ends as paused
        running = [p for p, f in zip(started, futures, strict=True) if not f.done()]
        fetching = [p for p in running if not group.has_fetched_all(p.id)]
        if len(fetching) < jobs and (len(running) < jobs or _room_beside(cfg, plan, group)):
            return
        group.wait_wake(0.5)


def _room_beside(cfg: DownloadConfig, plan: ArtifactPlan, group: RunGroup) -> bool:
    """Free disk beyond what the running artifacts still extract (and the reserve) holds plan's largest part."""
    still, _ = group.remaining()
    return free_bytes(cfg.dest) - still - cfg.reserve_bytes >= max(p.size for p in plan.parts)


def _first(errors: list[BaseException], group: RunGroup) -> BaseException:
    """The one error to raise for the run: disk full, then a real failure, then the user's stop."""
    if group.space_error is not None:
        return group.space_error
    for exc in errors:
        if isinstance(exc, DownloadError) and not isinstance(exc, SpaceError):
            return exc
    for exc in errors:
        if not isinstance(exc, Stopped):
            return exc
    return errors[0]
