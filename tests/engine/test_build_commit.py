"""`engine build-image --commit REF --source DIR`: the tree at REF (not the checkout's HEAD) is built on the real
Docker into an image tagged with the commit and recorded as a build (issue 45)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from app.backend.engine.builds import store as builds
from app.backend.engine.builds.job import build_commit
from app.backend.engine.builds.image import ImageBuildRefused
from app.backend.recipe import SIMULATED_RECIPE, load_recipe
from app.backend.config.settings import Settings


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, text: str) -> str:
    (repo / "version.txt").write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", text)
    return _git(repo, "rev-parse", "HEAD")


@pytest.mark.docker
def test_build_commit_builds_that_commits_tree(docker_client, tmp_path: Path) -> None:
    repo = tmp_path / "engine-src"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "Dockerfile").write_text("FROM scratch\nCOPY version.txt /version.txt\n")
    old = _commit(repo, "old")
    _commit(repo, "new")  # HEAD moves on: the build must still be of `old`
    name = f"moet-test-upg-{uuid.uuid4().hex[:8]}/engine"
    recipe = load_recipe(SIMULATED_RECIPE)
    recipe = recipe.model_copy(update={"engine": recipe.engine.model_copy(
        update={"image": f"{name}:pin", "dockerfile": "Dockerfile", "build_env": {}})})
    settings = Settings(SIMULATED_RECIPE, recipe, tmp_path / "data", True)
    lines: list[str] = []
    try:
        out = build_commit(settings, old[:10], repo, lambda ev: lines.append(ev.line))
        assert out.result.ok, out.result.message
        assert out.build is not None and out.build.id == old[:7] and out.build.commit == old
        assert out.build.image == f"{name}:{old[:7]}" and out.build.size_bytes is not None
        img = docker_client.images.get(out.build.image)
        assert img.id and any(ln.startswith("Step 1/2") for ln in lines)
        assert builds.registry(settings).get(old[:7]).image == out.build.image
        with pytest.raises(ImageBuildRefused, match="not a commit"):
            build_commit(settings, "no-such-ref", repo, lambda ev: None)
    finally:
        for tag in (f"{name}:{old[:7]}",):
            try:
                docker_client.images.remove(tag, force=True)
            except Exception:
                pass
