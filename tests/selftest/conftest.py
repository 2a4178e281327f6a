"""Self-test / A/B fixtures: the engine tests' real-Docker controller on the SIMULATED image, the
simulated engine as a local process (`make_sim`), and a demo-mode AppState for the browser tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.backend.config.settings import Settings, resolve_settings
from app.backend.state import AppState, build_app_state
from tests.engine.conftest import (  # noqa: F401
    TEST_LABEL, docker_client, make_controller, panel_containers, sim_settings,
)
from tests.simengine.conftest import make_sim  # noqa: F401  (fixture)

# Fast but faithful: decode at the card's rate, prefill fast enough that a 256K needle takes ~1 s.
FAST_ENV = {"MOET_SIM_BOOT_S": "1", "MOET_SIM_PREFILL_TOK_S": "400000"}


def start_ready(ctl: Any, profile_id: str = "quality", timeout: float = 90) -> Any:
    ticket = ctl.start(profile_id)
    assert ticket.accepted, ticket.message
    snap = ctl.wait_for(lambda s: s.is_ready or s.state.value == "failed", timeout)
    assert snap.is_ready, f"engine not ready: {snap.state} {snap.message}"
    # the start operation itself ends a moment after the state turns ready; the self-test refuses until then
    deadline = time.monotonic() + 10
    while ctl.busy() is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ctl.busy() is None, f"engine still busy: {ctl.busy()}"
    return snap


def recipe_file(tmp_path: Path, settings: Settings) -> Path:
    """The simulated recipe as a TOML file with the test's recipe id and port (for the CLIs)."""
    from app.backend.recipe import SIMULATED_RECIPE

    r = settings.recipe
    text = Path(SIMULATED_RECIPE).read_text()
    text = text.replace('id = "simulated"', f'id = "{r.id}"', 1).replace("port = 8000", f"port = {r.serve.port}")
    text = text.replace('"--port", "8000"', f'"--port", "{r.serve.port}"')
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return path


@pytest.fixture
def demo_state(docker_client: Any, sim_settings: Settings, tmp_path: Path) -> Iterator[AppState]:  # noqa: F811
    """A demo-mode AppState on the test's simulated recipe; its engine containers are removed after."""
    settings = resolve_settings(recipe_file(tmp_path, sim_settings), tmp_path / "data", demo=True)
    settings.ensure_state_dir()
    state = build_app_state(settings)
    assert state.engine is not None
    state.engine.options.extra_labels = dict(TEST_LABEL)
    state.engine.options.extra_env = dict(FAST_ENV)
    try:
        yield state
    finally:
        state.close()
        for c in panel_containers(docker_client, settings.recipe.id, running_only=False):  # its own recipe id
            c.remove(force=True)
