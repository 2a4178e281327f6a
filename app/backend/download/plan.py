"""What to download: parts per artifact (from the tree listing), the pinned commit, the disk preflight."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.backend.download.extract import free_bytes
from app.backend.download.hub import HubClient, TreeEntry, plain_name
from app.backend.download.journal import JournalStore
from app.backend.download.types import (
    ArtifactPlan, ArtifactState, DiskPicture, DownloadConfig, DownloadError, NotFoundError, PartInfo, SpaceError,
)
from app.backend.contracts import GiB

if TYPE_CHECKING:  # the artifact processes import this module: no pydantic there (forkserver.PRELOAD)
    from app.backend.recipe.schema import ArtifactSpec


@dataclass
class Prepared:
    hub: HubClient
    plans: list[ArtifactPlan]
    commit: str
    disk: DiskPicture


def select_parts(entries: list[TreeEntry], prefix: str) -> tuple[PartInfo, ...]:
    """Files named `<prefix>*`, in the card's `sort` order; each must carry an LFS sha256."""
    parts = []
    for e in sorted(entries, key=lambda e: e.path):
        if e.path.startswith(prefix):
            if not plain_name(e.path):  # it becomes a staging file name: no '/', no '..' (issue 13)
                raise DownloadError(f"refused part name {e.path[:120]!r} from the listing: a part must be a plain "
                                    f"file name starting with {prefix!r}; this is not the chunked cache repo")
            if not e.sha256:
                raise DownloadError(f"{e.path} has no LFS sha256 in the listing, so it cannot be verified; "
                                    "this does not look like the chunked cache repo")
            parts.append(PartInfo(e.path, e.size, e.sha256))
    return tuple(parts)


def build_plans(entries: list[TreeEntry], specs: list[ArtifactSpec], cfg: DownloadConfig) -> list[ArtifactPlan]:
    plans = []
    for spec in specs:
        parts = select_parts(entries, spec.prefix)
        if not parts:
            raise NotFoundError(f"no files named {spec.prefix}* in {cfg.repo} at revision {cfg.revision} "
                                f"({cfg.endpoint}); check --repo/--revision")
        compressed = sum(p.size for p in parts)
        # not the recipe's repo: compressed × safety factor, refined from the tar headers as they come
        estimate = int(spec.extracted_gib * GiB) if cfg.recipe_repo else int(compressed * cfg.safety_factor)
        plans.append(ArtifactPlan(spec.id, spec.prefix, spec.yields, parts, estimate))
    return plans


def prepare(cfg: DownloadConfig, specs: list[ArtifactSpec], hub: HubClient | None = None,
            jobs: int = 1) -> Prepared:
    """List the files and pin the commit in one answer (hub.py), build plans, check the disk."""
    hub = hub or HubClient(cfg)
    entries = hub.list_files(cfg.revision)  # sets hub.commit: every sha256 below belongs to it
    plans = build_plans(entries, specs, cfg)
    commit = hub.commit
    assert commit is not None  # list_files raises rather than leave it unset
    hub.resolve(plans[0].parts[0].name, commit, fresh=True)  # fails early: auth, gating, X-Repo-Commit
    disk = preflight(plans, cfg, jobs)
    return Prepared(hub, plans, commit, disk)


def remaining_extract(plan: ArtifactPlan, store: JournalStore) -> int:
    j = store.load(plan.id)
    if j is None:
        return plan.extracted_estimate
    if j.state == ArtifactState.DONE:
        return 0
    return max(plan.extracted_estimate - sum(j.files_done.values()), 0)


def staging_budget(free: int, staged: int, remaining: int, largest_part: int, compressed: int,
                   cfg: DownloadConfig, share: int = 1) -> int:
    """Staging may use what the extracted trees will not need; at least one part, at most cfg.staging_max.

    By default it may hold the whole compressed artifact (then a crash never costs a re-download).
    `remaining` is what every running artifact still extracts; the room left is split `share` ways
    (one share per running artifact), so artifacts running at once never count the same free bytes.
    """
    cap = cfg.staging_max if cfg.staging_max is not None else compressed
    room = staged + (free - remaining - cfg.reserve_bytes) // max(share, 1)
    return max(largest_part, min(cap, room))


def preflight(plans: list[ArtifactPlan], cfg: DownloadConfig, jobs: int = 1) -> DiskPicture:
    """Peak need = remaining extracted size + minimal staging (the largest part of each of the `jobs`
    artifacts that run at once). Refuse with numbers."""
    store = JournalStore(cfg.dest)
    probe = _existing_parent(cfg.dest)
    free = free_bytes(probe)
    remaining = sum(remaining_extract(p, store) for p in plans)
    todo = [p for p in plans if remaining_extract(p, store) > 0] or plans
    largest = sum(sorted((max(x.size for x in p.parts) for p in todo), reverse=True)[:max(jobs, 1)])
    needed = remaining + largest + cfg.reserve_bytes
    budget = staging_budget(free, 0, remaining, largest, max(p.compressed for p in todo), cfg)
    if free < needed:
        raise SpaceError(f"not enough disk space on {probe}: need {needed / GiB:.2f} GiB at peak "
                         f"({remaining / GiB:.2f} GiB extracted + {largest / GiB:.2f} GiB staging + "
                         f"{cfg.reserve_bytes / GiB:.2f} GiB reserve), {free / GiB:.2f} GiB free; "
                         f"free {(needed - free) / GiB:.2f} GiB or choose another --dest")
    return DiskPicture(free=free, needed=needed, staging_budget=budget, path=str(probe))


def _existing_parent(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p
