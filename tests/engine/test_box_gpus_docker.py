"""A SIMULATED box of two GPUs on real Docker (issue 43): one engine per GPU from the CLI, status lists both,
a rolling switch moves both to another profile, stop ends both. Polls with deadlines; cleans up on failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine.conftest import panel_containers

REPO = Path(__file__).resolve().parents[2]


def cli(recipe_file: Path, data_dir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MOET_SIM_BOOT_S": "1", "MOET_PANEL_GPU": "simulated", "MOET_PANEL_SIM_GPUS": "2"}
    return subprocess.run([sys.executable, "-m", "app.cli.main", *args, "--recipe", str(recipe_file),
                           "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=REPO)


@pytest.mark.slow
def test_two_gpus_two_engines_rolling_switch(docker_client, sim_settings, sim_image, recipe_file) -> None:
    st = sim_settings
    try:
        r = cli(recipe_file, st.data_dir, "engine", "start", "--profile", "quality", "--gpu", "all", "--demo")
        assert r.returncode == 0, r.stdout + r.stderr
        running = panel_containers(docker_client, st.recipe.id)
        assert sorted(c.labels.get("moet-panel.gpu") for c in running) == ["0", "1"]
        assert len({c.name for c in running}) == 2

        r = cli(recipe_file, st.data_dir, "engine", "status", "--json", "--demo")
        engines = json.loads(r.stdout)["engines"]
        assert [(e["gpu"], e["state"], e["profile"]) for e in engines] == [(0, "ready", "quality"), (1, "ready", "quality")]
        assert engines[0]["listens"] != engines[1]["listens"] and all(e["listens"] for e in engines)
        text = cli(recipe_file, st.data_dir, "engine", "status", "--demo").stdout
        assert "GPU 0: ready" in text and "GPU 1: ready" in text

        r = cli(recipe_file, st.data_dir, "engine", "switch", "--profile", "balanced", "--gpu", "all", "--demo")
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.index("GPU 0:") < r.stdout.index("GPU 1:")  # one GPU at a time, in order
        engines = json.loads(cli(recipe_file, st.data_dir, "engine", "status", "--json", "--demo").stdout)["engines"]
        assert [(e["state"], e["profile"]) for e in engines] == [("ready", "balanced")] * 2

        r = cli(recipe_file, st.data_dir, "engine", "stop", "--gpu", "1", "--demo")
        assert r.returncode == 0, r.stdout + r.stderr
        assert [c.labels.get("moet-panel.gpu") for c in panel_containers(docker_client, st.recipe.id)] == ["0"]
        r = cli(recipe_file, st.data_dir, "engine", "start", "--profile", "quality", "--gpu", "5", "--demo")
        assert r.returncode == 2 and "GPU 5" in r.stderr
    finally:
        for c in panel_containers(docker_client, st.recipe.id, running_only=False):
            c.remove(force=True)


@pytest.mark.slow
def test_the_panel_runs_an_engine_per_gpu_and_its_gateway_sees_the_box(docker_client, tmp_path, monkeypatch) -> None:
    from app.backend.gateway.routing import BoxSource
    from tests.engine.conftest import sim_panel_state

    monkeypatch.setenv("MOET_PANEL_SIM_GPUS", "2")
    monkeypatch.setenv("MOET_PANEL_GPU", "simulated")
    with sim_panel_state(docker_client, tmp_path / "d") as state:
        try:
            box = state.box
            assert box is not None and box.gpus == [0, 1] and state.engine is box.controller(0)
            for g in box.gpus:
                box.controller(g).options.extra_env = {"MOET_SIM_BOOT_S": "1"}
            for _, t in box.start("quality", box.gpus):
                assert t.wait(120) and t.ok, t.message
            source = state.gateway._source
            assert isinstance(source, BoxSource)
            status = source.status()
            assert status.accepts and [e.gpu for e in status.engines if e.accepts] == [0, 1]
            box.leave_out([0], "self-test")
            assert [e.gpu for e in source.status().engines if e.accepts] == [1]
            # the SIMULATED card of each GPU follows that GPU's engine
            assert all(g.memory_used > 0 for g in state.gpu.read())
        finally:
            state.close()
