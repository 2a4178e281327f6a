"""The one exports folder and the per-process web cache folder (app/backend/web/exports.py): private modes,
safe names, a dead panel's cache swept, a live one's kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.backend.web.exports import exports_dir, safe_name, sweep_web_temp_dirs, web_temp_dir, write_export


def test_exports_are_private_and_named_safely(tmp_path: Path) -> None:
    state = tmp_path / ".moet-panel"
    path = write_export(state, "../../etc/abtest-x y.md", "text")
    assert path.parent == exports_dir(state) and path.name == "_.._etc_abtest-x_y.md"
    assert os.stat(state).st_mode & 0o777 == 0o700 and os.stat(path.parent).st_mode & 0o777 == 0o700
    assert os.stat(path).st_mode & 0o777 == 0o600 and path.read_text() == "text"
    assert safe_name(".hidden") == "hidden" and len(safe_name("x" * 300 + ".json")) == 160
    assert safe_name("x" * 300 + ".json").endswith(".json")


def test_sweep_removes_only_dead_panels_cache(tmp_path: Path) -> None:
    state = tmp_path / ".moet-panel"
    mine = web_temp_dir(state)
    assert mine.name == f"gradio-{os.getpid()}" and os.stat(mine).st_mode & 0o777 == 0o700
    dead_pid = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout.strip()
    dead = state / f"gradio-{dead_pid}"
    dead.mkdir()
    (dead / "f").write_text("x")
    alive = state / "gradio-1"  # pid 1 is always alive
    alive.mkdir()
    other = state / "gradio-notapid"
    other.mkdir()
    assert sweep_web_temp_dirs(state) == [dead]
    assert mine.exists() and alive.exists() and other.exists() and not dead.exists()
