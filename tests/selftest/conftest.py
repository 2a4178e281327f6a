"""Self-test / A/B fixtures: the engine tests' real-Docker controller on the SIMULATED image."""

from __future__ import annotations

import time

from tests.engine.conftest import docker_client, make_controller, sim_settings, wait_until  # noqa: F401

# Fast but faithful: decode at the card's rate, prefill fast enough that a 256K needle takes ~1 s.
FAST_ENV = {"MOET_SIM_BOOT_S": "1", "MOET_SIM_PREFILL_TOK_S": "400000"}


def start_ready(ctl, profile_id: str = "quality", timeout: float = 90):
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


def recipe_file(tmp_path, sim_settings):
    """The simulated recipe as a TOML file with the test's recipe id and port (for the CLIs)."""
    from pathlib import Path

    from app.backend.recipe import SIMULATED_RECIPE

    r = sim_settings.recipe
    text = Path(SIMULATED_RECIPE).read_text()
    text = text.replace('id = "simulated"', f'id = "{r.id}"', 1).replace("port = 8000", f"port = {r.serve.port}")
    text = text.replace('"--port", "8000"', f'"--port", "{r.serve.port}"')
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    return path
