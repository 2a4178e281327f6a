"""`moet-panel selftest` against a running SIMULATED engine (real Docker); it never starts one."""

from __future__ import annotations

import json

from app.backend.settings import resolve_settings
from app.cli.main import main
from tests.selftest.conftest import FAST_ENV, recipe_file, start_ready


def test_selftest_cli_json_and_refusal(make_controller, sim_settings, tmp_path, capsys) -> None:
    path = recipe_file(tmp_path, sim_settings)
    settings = resolve_settings(path, sim_settings.data_dir)
    common = ["--recipe", str(path), "--data-dir", str(sim_settings.data_dir)]
    assert main(["selftest", *common, "--profile", "quality", "--runs", "1"]) == 1
    assert "start profile quality first" in capsys.readouterr().err
    start_ready(make_controller(settings=settings, extra_env=FAST_ENV))
    assert main(["selftest", *common, "--profile", "speed"]) == 1
    assert "switch to speed first" in capsys.readouterr().err
    assert main(["selftest", *common, "--profile", "quality", "--needle", "64kb"]) == 2
    assert "not a number of tokens" in capsys.readouterr().err
    rc = main(["selftest", *common, "--profile", "quality", "--runs", "2", "--decode-tokens", "60",
               "--needle", "64k", "--ttft", "", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    data = json.loads(out.out)
    assert data["profile_id"] == "quality" and len(data["decode"]) == 2
    assert data["summary"]["needles"] == ["64K: 3/3 depths (0.05 ✓, 0.5 ✓, 0.95 ✓)"]
    assert data["summary"]["card_line"].startswith("card 48.9 · SIMULATED box")
    assert "about" in out.err and "decode run 2/2" in out.err
