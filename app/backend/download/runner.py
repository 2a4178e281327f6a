"""A whole download run: lock the destination, list + pin + preflight, then each artifact in turn."""

from __future__ import annotations

import shutil
import threading
from typing import Callable

from app.backend.download.job import ArtifactRun
from app.backend.download.journal import DestLock, JournalStore, staging_dir
from app.backend.download.plan import Prepared, prepare
from app.backend.download.progress import ProgressBoard
from app.backend.download.types import ArtifactProgress, ArtifactState, DownloadConfig, Notice
from app.backend.recipe.schema import ArtifactSpec


def register_plans(board: ProgressBoard, prepared: Prepared) -> None:
    for plan in prepared.plans:
        board.register(ArtifactProgress(id=plan.id, total_bytes=plan.compressed, parts_total=len(plan.parts),
                                        estimate=plan.extracted_estimate))


def run_download(cfg: DownloadConfig, specs: list[ArtifactSpec], board: ProgressBoard, stop: threading.Event,
                 on_prepared: Callable[[Prepared], None] | None = None) -> Prepared:
    """Download + verify + extract every artifact in `specs` into cfg.dest.

    Raises DownloadError subclasses (LockedError, SpaceError, AuthError, ...) or Stopped; the per-artifact
    state (done / paused / failed with reason) is on the board and in the journal either way.
    """
    with DestLock(cfg.dest):
        prepared = prepare(cfg, specs)
        try:
            register_plans(board, prepared)
            board.set_disk(prepared.disk)
            if on_prepared:
                on_prepared(prepared)
            store = JournalStore(cfg.dest)
            store.ensure_reserve()
            for plan in prepared.plans:
                j = store.load(plan.id)
                if j is not None and j.matches(plan, cfg.repo) and j.state == "done" \
                        and (cfg.dest / plan.yields).is_dir():
                    board.update(plan.id, state=ArtifactState.DONE, verified_bytes=plan.compressed,
                                 fetched_bytes=plan.compressed, parts_verified=len(plan.parts),
                                 reason="already complete")
                    continue
                if j is None or not j.matches(plan, cfg.repo):
                    if j is not None:  # the repo changed under us: old staging is useless
                        shutil.rmtree(staging_dir(cfg.dest, plan.id), ignore_errors=True)
                        board.event(Notice(plan.id, message="the repo's parts changed since the last run; starting over"))
                    j = store.fresh(plan, cfg.repo, prepared.commit, cfg.endpoint, cfg.segment_size)
                j.commit, j.endpoint = prepared.commit, cfg.endpoint
                ArtifactRun(cfg, prepared.hub, plan, j, store, board, stop).run()
        finally:
            prepared.hub.close()
    return prepared
