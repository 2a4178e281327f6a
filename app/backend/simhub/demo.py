"""DEMO mode hub: a small real planescache artifact for the simulated recipe, served on 127.0.0.1.

Everything it serves is SIMULATED (the repo has a README saying so, and the panel labels it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from app.backend.recipe import SIMULATED_RECIPE, load_recipe
from app.backend.simhub.artifacts import TreeSpec, build_artifact, generate_tree
from app.backend.simhub.server import SimHub

DEMO_PART_SIZE = 1 << 20


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
        if not parts or not (work_dir / f".built-{art.id}").exists():
            src = work_dir / "src"
            ckpt = recipe.model.ckpt_id if art.id == "planescache" else None
            generate_tree(src, TreeSpec(top=art.yields, layers=4, file_size=192 * 1024,
                                        sparse_size=16 << 20, ckpt_id=ckpt, seed=7))
            parts = build_artifact(src, art.yields, out, art.prefix, DEMO_PART_SIZE)
            (work_dir / f".built-{art.id}").touch()
        files.update({p.name: p for p in parts})
    readme = out / "README.md"
    readme.write_text("# SIMULATED repo\nServed by moet-panel's local demo hub; not a real model.\n")
    files["README.md"] = readme
    return recipe.hub.repo, files


def start_demo_hub(work_dir: Path | str, port: int = 0, recipe_path: Path = SIMULATED_RECIPE,
                   rate_cap_bps: float | None = None) -> DemoHub:
    """Build the demo artifact under work_dir and serve it; call `.stop()` when done."""
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    repo, files = build_demo_repo(work, recipe_path)
    hub = SimHub(port=port, rate_cap_bps=rate_cap_bps)
    hub.add_repo(repo, files)
    hub.start()
    return DemoHub(endpoint=hub.endpoint, repo=repo, stop=hub.stop, hub=hub)
