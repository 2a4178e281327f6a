"""Fixtures for engine tests: a per-test simulated recipe (own port, own container names), real Docker
with the SIMULATED image, controllers that are always closed and containers that are always removed."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from app.backend.engine.controller import ControllerOptions, EngineController
from app.backend.recipe import SIMULATED_RECIPE, load_recipe
from app.backend.recipe.schema import ProfileSpec, Recipe
from app.backend.config.settings import Settings

TEST_LABEL = {"moet-panel.test": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sim_recipe(port: int, boot_timeout_s: int = 60, stop_grace_s: int = 5) -> Recipe:
    """The simulated recipe on its own port, with a unique id (so container names never collide)."""
    r = load_recipe(SIMULATED_RECIPE)
    args = list(r.serve.args)
    args[args.index("--port") + 1] = str(port)
    serve = r.serve.model_copy(update={"port": port, "args": args})
    from app.backend.simengine.image import content_tag

    engine = r.engine.model_copy(update={"boot_timeout_s": boot_timeout_s, "stop_grace_s": stop_grace_s,
                                         "image": content_tag()})
    return r.model_copy(update={"id": f"simtest-{port}", "serve": serve, "engine": engine})


def fail_profile(recipe: Recipe, mode: str, pid: str | None = None) -> ProfileSpec:
    """A custom profile = quality + MOET_SIM_FAIL=<mode> (how a user's broken custom profile looks)."""
    base = recipe.profile("quality")
    return base.model_copy(update={
        "id": pid or mode.replace("_", "-"), "number": 90, "title": f"fails: {mode}", "recommended": False,
        "env_add": {"MOET_SIM_FAIL": mode}, "measured": False,
    })


@pytest.fixture(scope="session")
def docker_client():
    docker = pytest.importorskip("docker")
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as exc:  # no daemon here: docker tests skip
        pytest.skip(f"Docker not reachable: {exc}")
    from app.backend.simengine.image import IMAGE_TAG, ImageBuildError, content_tag, ensure_image

    # this checkout's image under its content tag (sim_recipe runs it): the panel's engine needs this source's
    # features (--uds, issue 40), and the shared tag may be rebuilt meanwhile from another checkout
    ensure_image(client, tag=content_tag())
    try:
        ensure_image(client)  # the shared tag too: tests that start the stock SIMULATED recipe run it
    except ImageBuildError:
        # another session rebuilt the tag concurrently from a slightly different source: any sim image will do
        client.images.get(IMAGE_TAG)
    return client


@pytest.fixture
def sim_settings(tmp_path: Path) -> Settings:
    port = free_port()
    return Settings(recipe_path=SIMULATED_RECIPE, recipe=sim_recipe(port), data_dir=tmp_path / "data", demo=True)


@pytest.fixture
def make_controller(docker_client, sim_settings) -> Iterator[Callable[..., EngineController]]:
    """Factory for controllers on real Docker; teardown closes them and removes every test container."""
    from app.backend.engine.runtime.docker import DockerRuntime

    made: list[EngineController] = []

    def make(settings: Settings | None = None, profiles: list[ProfileSpec] | None = None, **opts) -> EngineController:
        st = settings or sim_settings
        extra_env = {"MOET_SIM_BOOT_S": "1", **opts.pop("extra_env", {})}
        options = ControllerOptions(extra_env=extra_env, extra_labels=dict(TEST_LABEL), **opts)
        pool = list(st.recipe.profiles) + list(profiles or [])
        ctl = EngineController(st, DockerRuntime(docker_client), profiles_fn=lambda: pool, options=options)
        made.append(ctl)
        return ctl

    try:
        yield make
    finally:
        for ctl in made:
            ctl.close()
        # by the test's own recipe id (simtest-<its port>), not the test label: a CLI the test runs in-process
        # (abtest switching profiles) starts containers through its own controller, without that label
        for c in panel_containers(docker_client, sim_settings.recipe.id, running_only=False):
            c.remove(force=True)


@contextmanager
def sim_panel_state(docker_client, data_dir: Path) -> Iterator[Any]:
    """An AppState for a browser test's panel: its own simulated recipe (own port and id), a 1 s boot, test-labelled
    containers and its data in `data_dir`. Every container of that recipe is removed on exit."""
    from app.backend.state import build_app_state

    recipe = sim_recipe(free_port())
    settings = Settings(SIMULATED_RECIPE, recipe, data_dir, True)
    settings.ensure_state_dir()
    state = build_app_state(settings)
    state.engine.options.extra_env = {"MOET_SIM_BOOT_S": "1"}
    state.engine.options.extra_labels = dict(TEST_LABEL)
    try:
        yield state
    finally:
        for c in docker_client.containers.list(all=True, filters={"label": f"moet-panel.recipe={recipe.id}"}):
            c.remove(force=True)


def panel_containers(client, recipe_id: str, running_only: bool = True) -> list:
    return client.containers.list(all=not running_only,
                                  filters={"label": ["moet-panel.managed=1", f"moet-panel.recipe={recipe_id}"]})


@pytest.fixture
def sim_image(docker_client) -> str:
    """This checkout's simulated engine under its content tag (a concurrent rebuild of :1 cannot swap it)."""
    from app.backend.simengine.image import content_tag, ensure_image

    return ensure_image(docker_client, tag=content_tag())


@pytest.fixture
def recipe_file(tmp_path: Path, sim_settings, sim_image) -> Path:
    """The per-test recipe as a TOML file, for the CLI in a child process (same id, port, image), with the 1 s boot
    `make_controller` gives its engines: an engine started from the CLI reads its MOET_SIM_BOOT_S from the recipe's
    env (the CLI's own environment does not reach the container)."""
    port = sim_settings.recipe.serve.port
    text = SIMULATED_RECIPE.read_text()
    assert text.count('MOET_SIM_BOOT_S = "4"') == 1
    text = text.replace('MOET_SIM_BOOT_S = "4"', 'MOET_SIM_BOOT_S = "1"')
    text = text.replace('id = "simulated"', f'id = "{sim_settings.recipe.id}"', 1)
    text = text.replace("port = 8000", f"port = {port}").replace('"--port", "8000"', f'"--port", "{port}"')
    text = text.replace('image = "moet-panel/sim-engine:2"', f'image = "{sim_image}"')
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return path
