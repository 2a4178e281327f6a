"""DEMO mode hub: a small real planescache artifact for the simulated recipe, served on 127.0.0.1.

Everything it serves is SIMULATED (the repo has a README saying so, and the panel labels it).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from app.backend.recipe import SIMULATED_RECIPE, load_recipe
from app.backend.simhub.artifacts import TreeSpec, build_artifact, generate_tree
from app.backend.simhub.server import SimHub

DEMO_PART_SIZE = 1 << 20
# A download slow enough to watch, pause and resume (issue 42: the demo artifact finished in under a second):
# ~15 MB of parts through one link paced to 2 MiB/s (~7 s), and a 256 MiB sparse pool file inside (its
# extracted size; it costs no disk). docs/downloads.md, "Demo mode".
DEMO_LINK_BPS = 2 * (1 << 20)
DEMO_LAYERS = 24
DEMO_SPARSE = 256 << 20
DEMO_BUILD = "v2"  # the stamp of what a demo dir holds: an older, smaller build is rebuilt


@dataclass
class DemoHub:
    endpoint: str
    repo: str
    stop: Callable[[], None]
    hub: SimHub
    label: str = "SIMULATED Hub (local demo server)"


def build_demo_repo(work_dir: Path, recipe_path: Path = SIMULATED_RECIPE) -> tuple[str, dict[str, Path]]:
    """Build (or reuse) the demo artifacts; returns (repo, {repo path: local file})."""
    recipe = load_recipe(recipe_path)
    out = work_dir / "repo"
    files: dict[str, Path] = {}
    for art in recipe.artifacts:
        parts = sorted(out.glob(art.prefix + "*"))
        stamp = work_dir / f".built-{art.id}-{DEMO_BUILD}"
        if not parts or not stamp.exists():
            for old in parts:  # a former build's parts (another part count) must not stay listed
                old.unlink()
            src = work_dir / "src"
            ckpt = recipe.model.ckpt_id if art.id == "planescache" else None
            shutil.rmtree(src, ignore_errors=True)
            generate_tree(src, TreeSpec(top=art.yields, layers=DEMO_LAYERS, file_size=192 * 1024,
                                        sparse_size=DEMO_SPARSE, ckpt_id=ckpt, seed=7))
            parts = build_artifact(src, art.yields, out, art.prefix, DEMO_PART_SIZE)
            stamp.touch()
        files.update({p.name: p for p in parts})
    readme = out / "README.md"
    readme.write_text("# SIMULATED repo\nServed by moet-panel's local demo hub; not a real model.\n")
    files["README.md"] = readme
    return recipe.hub.repo, files


def start_demo_hub(work_dir: Path | str, port: int = 0, recipe_path: Path = SIMULATED_RECIPE,
                   rate_cap_bps: float | None = None, link_cap_bps: float | None = DEMO_LINK_BPS) -> DemoHub:
    """Build the demo artifact under work_dir and serve it through a link of `link_cap_bps` (None: as fast
    as the box goes); call `.stop()` when done."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    repo, files = build_demo_repo(work, recipe_path)
    hub = SimHub(port=port, rate_cap_bps=rate_cap_bps, link_cap_bps=link_cap_bps)
    hub.add_repo(repo, files)
    hub.start()
    return DemoHub(endpoint=hub.endpoint, repo=repo, stop=hub.stop, hub=hub)
