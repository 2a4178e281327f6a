"""`moet-panel gateway` (the standalone form) keeps the panel's gateway's promises on a SIMULATED box of two GPUs
(issue 50 item 1; docs/gateway.md "One gateway"): it sees both GPUs' engines and spreads answers over them (two
at once take about as long as one), a CLI `engine switch` (a rolling one, over both GPUs) drains the answer it
streams (the answer finishes whole: its count is published for the CLI's drain) and refuses nobody meanwhile (the
CLI's drain note moves new answers to the other GPU). Real Docker, the SIMULATED engine, the CLI and the gateway
in child processes; every process and container is stopped even on failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gateway.standalone_box import Asker, at_once, rolling_switch_while_streaming
from tests.engine.conftest import free_port, panel_containers
from tests.polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.docker]
REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "MOET_PANEL_GPU": "simulated", "MOET_PANEL_SIM_GPUS": "2"}


def _cli(recipe: Path, data: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli.main", *args, "--recipe", str(recipe), "--data-dir",
                           str(data), "--demo"], capture_output=True, text=True, timeout=timeout, env=_env(), cwd=REPO)


def test_the_standalone_gateway_spreads_over_two_gpus_and_every_drain_waits_for_it(
        docker_client, sim_settings, recipe_file) -> None:
    data = sim_settings.data_dir
    gw: subprocess.Popen[str] | None = None
    try:
        r = _cli(recipe_file, data, "engine", "start", "--profile", "quality", "--gpu", "all")
        assert r.returncode == 0, r.stdout + r.stderr
        key = json.loads(_cli(recipe_file, data, "keys", "create", "box", "--json").stdout)["key"]
        port = free_port()
        gw = subprocess.Popen([sys.executable, "-m", "app.cli.main", "gateway", "--port", str(port), "--rate",
                               "100000", "--recipe", str(recipe_file), "--data-dir", str(data), "--demo"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=REPO)
        asker = Asker(f"http://127.0.0.1:{port}", key)
        wait_for(asker.serving, 60, "the standalone gateway serves")
        # both GPUs: two answers at once take about as long as one (the card's one sequence per engine)
        asker.ask(4)
        one = min(asker.ask(100)[4] for _ in range(2))
        together, both = at_once(asker, 2, 100)
        print(f"moet-panel gateway, two SIMULATED GPUs: one answer of 100 tokens {one:.2f} s; two at once "
              f"{together:.2f} s = {together / one:.2f}x, on GPUs {sorted(b[3] for b in both)}")
        assert sorted(b[3] for b in both) == ["0", "1"] and all(b[0] == 200 and b[1] for b in both), both
        assert together <= 1.2 * one, f"two at once {together:.2f} s vs one {one:.2f} s"

        # a rolling CLI switch while a long answer streams (on GPU 0, the least busy's tie) and a client calls in a
        # loop: the long answer finishes whole, nobody is refused or cut
        cli = [sys.executable, "-m", "app.cli.main", "--recipe", str(recipe_file), "--data-dir", str(data), "--demo"]
        r, whole, loop = rolling_switch_while_streaming(asker, cli, _env(), 200)
        assert r.returncode == 0, r.stdout + r.stderr
        refused = [x for x in loop if x[0] != 200]
        cut = [x for x in loop if x[0] == 200 and not x[1]]
        print(f"rolling switch during a 200-token answer: {whole}; client loop {len(loop)} requests, refused "
              f"{len(refused)}, cut {len(cut)}, answered per GPU {({g: sum(1 for x in loop if x[3] == g) for g in '01'})}")
        assert whole is not None and whole[:3] == (200, True, 200), whole  # whole: every token, then [DONE]
        assert loop and not refused and not cut, (len(loop), refused, cut)
        status = json.loads(_cli(recipe_file, data, "engine", "status", "--json").stdout)["engines"]
        assert [(e["state"], e["profile"]) for e in status] == [("ready", "balanced")] * 2
    finally:
        if gw is not None:
            gw.terminate()
            try:
                gw.wait(15)
            except subprocess.TimeoutExpired:
                gw.kill()
                gw.wait()
        for c in panel_containers(docker_client, sim_settings.recipe.id, running_only=False):
            c.remove(force=True)
