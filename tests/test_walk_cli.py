"""Issue 49, a new user's walk on the command line: `moet-panel engine status | head` ends quietly (no
BrokenPipeError), and the SIMULATED box's GPU count set for `serve --demo` is remembered by its data dir, so a
CLI in another shell sees the same box."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.backend.config import simbox
from tests.journey.conftest import user_data_dir

ROOT = Path(__file__).resolve().parents[1]


def test_a_reader_that_goes_away_ends_the_cli_quietly() -> None:
    """The pipe's reading end is closed before the CLI writes (as `| head` does once it has its lines): the CLI
    exits on SIGPIPE's status without a traceback, not with BrokenPipeError's."""
    with user_data_dir() as data:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MOET_PANEL_DATA_DIR": str(data), "MOET_PANEL_GPU": "simulated"}
        proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "engine", "status", "--demo"], cwd=ROOT,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # nobody reads: every write of the CLI fails with EPIPE
        err = proc.stderr.read().decode()
        rc = proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert rc == 141, (rc, err)


def test_the_simulated_gpu_count_is_remembered_by_the_data_dir(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MOET_PANEL_SIM_GPUS", raising=False)
    assert simbox.sim_gpu_count(tmp_path) == 1  # never set: one GPU
    monkeypatch.setenv("MOET_PANEL_SIM_GPUS", "3")  # `MOET_PANEL_SIM_GPUS=3 moet-panel serve --demo`
    assert simbox.sim_gpu_count(tmp_path) == 3
    monkeypatch.delenv("MOET_PANEL_SIM_GPUS")  # another shell, without the variable
    assert simbox.sim_gpu_count(tmp_path) == 3
    assert simbox.sim_gpu_count(tmp_path / "elsewhere") == 1  # another data dir: its own box
    monkeypatch.setenv("MOET_PANEL_SIM_GPUS", "2")  # set again: the new count is used and remembered
    assert simbox.sim_gpu_count(tmp_path) == 2
    monkeypatch.delenv("MOET_PANEL_SIM_GPUS")
    assert simbox.sim_gpu_count(tmp_path) == 2


def test_the_cli_reads_the_remembered_box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.backend.config.settings import resolve_settings
    from app.backend.recipe import SIMULATED_RECIPE
    from app.backend.telemetry.gpu import box_gpu_count, make_gpu_reader

    monkeypatch.setenv("MOET_PANEL_GPU", "simulated")
    settings = resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)
    monkeypatch.setenv("MOET_PANEL_SIM_GPUS", "2")
    assert box_gpu_count(make_gpu_reader(settings)) == 2  # the panel, started with the variable
    monkeypatch.delenv("MOET_PANEL_SIM_GPUS")
    assert box_gpu_count(make_gpu_reader(settings)) == 2  # the CLI, without it
