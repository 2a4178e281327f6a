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
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.engine.conftest import free_port, panel_containers
from tests.polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.docker]
REPO = Path(__file__).resolve().parents[2]
MODEL = "deepseek-v4-flash"


def _env() -> dict[str, str]:
    return {**os.environ, "MOET_PANEL_GPU": "simulated", "MOET_PANEL_SIM_GPUS": "2"}


def _cli(recipe: Path, data: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli.main", *args, "--recipe", str(recipe), "--data-dir",
                           str(data), "--demo"], capture_output=True, text=True, timeout=timeout, env=_env(), cwd=REPO)


class Asker:
    def __init__(self, url: str, key: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"})

    def ask(self, tokens: int, started: threading.Event | None = None) -> tuple[int, bool, int, str, float]:
        """(status, ended with [DONE], completion tokens the engine counted, the GPU that answered, seconds)."""
        t = time.monotonic()
        body = {"model": MODEL, "messages": [{"role": "user", "content": "tell me about experts"}],
                "max_tokens": tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        try:
            with self.client.stream("POST", "/v1/chat/completions", json=body) as r:
                text = ""
                for part in r.iter_text():
                    text += part
                    if started is not None and "data:" in text:
                        started.set()
                usage = 0
                for line in text.splitlines():
                    if line.startswith("data: {") and '"usage"' in line:
                        u = json.loads(line[6:]).get("usage") or {}
                        usage = int(u.get("completion_tokens") or usage)
                return r.status_code, "[DONE]" in text, usage, r.headers.get("x-moet-panel-gpu", "?"), time.monotonic() - t
        except httpx.HTTPError:
            return 599, False, 0, "?", time.monotonic() - t


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

        def serving() -> bool:
            try:
                return asker.client.get("/v1/models").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(serving, 60, "the standalone gateway serves")
        # both GPUs: two answers at once take about as long as one (the card's one sequence per engine)
        asker.ask(4)
        one = min(asker.ask(100)[4] for _ in range(2))
        both: list[tuple[int, bool, int, str, float]] = []
        threads = [threading.Thread(target=lambda: both.append(asker.ask(100))) for _ in range(2)]
        t0 = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        together = time.monotonic() - t0
        assert sorted(b[3] for b in both) == ["0", "1"] and all(b[0] == 200 and b[1] for b in both), both
        print(f"moet-panel gateway, two SIMULATED GPUs: one answer of 100 tokens {one:.2f} s; two at once "
              f"{together:.2f} s = {together / one:.2f}x, on GPUs {sorted(b[3] for b in both)}")
        assert together <= 1.2 * one, f"two at once {together:.2f} s vs one {one:.2f} s"

        # a rolling CLI switch while a long answer streams (on GPU 0, the least busy's tie) and a client calls in a
        # loop: the long answer finishes whole, nobody is refused or cut
        started = threading.Event()
        long: list[tuple[int, bool, int, str, float]] = []
        long_th = threading.Thread(target=lambda: long.append(asker.ask(200, started)))
        long_th.start()
        assert started.wait(30), "the long answer started streaming"
        stop = threading.Event()
        loop: list[tuple[int, bool, int, str, float]] = []

        def caller() -> None:
            while not stop.is_set():
                loop.append(asker.ask(20))

        loop_th = threading.Thread(target=caller)
        loop_th.start()
        try:
            r = _cli(recipe_file, data, "engine", "switch", "--profile", "balanced")
        finally:
            stop.set()
            loop_th.join(60)
            long_th.join(60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert long and long[0][:3] == (200, True, 200), long  # whole: every token, then [DONE]
        refused = [x for x in loop if x[0] != 200]
        cut = [x for x in loop if x[0] == 200 and not x[1]]
        print(f"rolling switch during a 200-token answer: {long[0][2]} tokens, [DONE] {long[0][1]}; client loop "
              f"{len(loop)} requests, refused {len(refused)}, cut {len(cut)}, answered per GPU "
              f"{ {g: sum(1 for x in loop if x[3] == g) for g in ('0', '1')} }")
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
