"""Benchmark: `moet-panel gateway` (the standalone form) on a SIMULATED box of several GPUs (issue 50 item 1).

    .venv/bin/python bench/gateway/standalone_box.py [--gpus 2] [--tokens 100] [--long 200]

The engines are started by the CLI (`moet-panel engine start --gpu all`, real Docker, one SIMULATED engine per
GPU, the card's one sequence each), the gateway is `moet-panel gateway` in its own process, a client calls it over
HTTP. Prints:

* one answer of --tokens alone, then --gpus at once: the ratio (goal ≤ 1.2× for two) and the GPUs that answered;
* a rolling `moet-panel engine switch --profile balanced` (every GPU, one at a time) while a --long answer
  streams and a client calls in a loop: the long answer's tokens and [DONE] (goal: whole), the loop's requests
  refused and cut (goal: 0), and the answers per GPU.

Everything it starts (the gateway, the containers, a data dir under $HOME) is removed at the end, even on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.panelproc import free_port, recipe_copy, stop_all  # noqa: E402

MODEL = "deepseek-v4-flash"
Answer = tuple[int, bool, int, str, float]  # status, ended with [DONE], completion tokens, GPU, seconds


class Asker:
    """Streamed chat completions through the gateway, with the engine's usage."""

    def __init__(self, url: str, key: str) -> None:
        import httpx

        self.client = httpx.Client(base_url=url, timeout=120, headers={"Authorization": f"Bearer {key}"})

    def serving(self) -> bool:
        import httpx

        try:
            return self.client.get("/v1/models").status_code == 200
        except httpx.HTTPError:
            return False

    def ask(self, tokens: int, started: threading.Event | None = None) -> Answer:
        import httpx

        t = time.monotonic()
        body = {"model": MODEL, "messages": [{"role": "user", "content": "tell me about experts"}],
                "max_tokens": tokens, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
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
                        usage = int((json.loads(line[6:]).get("usage") or {}).get("completion_tokens") or usage)
                return r.status_code, "[DONE]" in text, usage, r.headers.get("x-moet-panel-gpu", "?"), time.monotonic() - t
        except httpx.HTTPError:
            return 599, False, 0, "?", time.monotonic() - t


def at_once(asker: Asker, n: int, tokens: int) -> tuple[float, list[Answer]]:
    out: list[Answer] = []
    threads = [threading.Thread(target=lambda: out.append(asker.ask(tokens))) for _ in range(n)]
    t = time.monotonic()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.monotonic() - t, out


def rolling_switch_while_streaming(asker: Asker, cli: list[str], env: dict[str, str], long: int
                                   ) -> tuple[subprocess.CompletedProcess[str], Answer | None, list[Answer]]:
    """A rolling CLI switch to balanced while a `long` answer streams and a client calls in a loop."""
    started = threading.Event()
    got: list[Answer] = []
    long_th = threading.Thread(target=lambda: got.append(asker.ask(long, started)))
    long_th.start()
    started.wait(30)
    stop = threading.Event()
    loop: list[Answer] = []

    def caller() -> None:
        while not stop.is_set():
            loop.append(asker.ask(20))

    loop_th = threading.Thread(target=caller)
    loop_th.start()
    try:
        r = subprocess.run([*cli, "engine", "switch", "--profile", "balanced"], capture_output=True, text=True,
                           env=env, cwd=ROOT, timeout=300)
    finally:
        stop.set()
        loop_th.join(60)
        long_th.join(60)
    return r, (got[0] if got else None), loop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--long", type=int, default=200)
    args = ap.parse_args()
    data = Path.home() / f"moet-bench-gwbox-{os.getpid()}"
    data.mkdir(parents=True)
    rid = f"bench-gwbox-{os.getpid()}"
    recipe, _ = recipe_copy(ROOT, data, rid, boot_s="1")
    env = {**os.environ, "MOET_PANEL_GPU": "simulated", "MOET_PANEL_SIM_GPUS": str(args.gpus),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    cli = [sys.executable, "-m", "app.cli.main", "--demo", "--recipe", str(recipe), "--data-dir", str(data / "d")]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        r = subprocess.run([*cli, "engine", "start", "--profile", "quality", "--gpu", "all"], capture_output=True,
                           text=True, env=env, cwd=ROOT, timeout=300)
        if r.returncode != 0:
            raise SystemExit(f"engine start failed: {r.stdout}{r.stderr}")
        key = json.loads(subprocess.run([*cli, "keys", "create", "bench", "--json"], capture_output=True, text=True,
                                        env=env, cwd=ROOT, check=True).stdout)["key"]
        port = free_port()
        procs.append(subprocess.Popen([*cli, "gateway", "--port", str(port), "--rate", "100000"], env=env, cwd=ROOT,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        asker = Asker(f"http://127.0.0.1:{port}", key)
        deadline = time.monotonic() + 60
        while not asker.serving():
            if time.monotonic() > deadline:
                raise SystemExit("moet-panel gateway did not serve within 60 s")
            time.sleep(0.2)
        asker.ask(4)
        one = min(asker.ask(args.tokens)[4] for _ in range(2))
        together, answers = at_once(asker, args.gpus, args.tokens)
        print(f"moet-panel gateway, {args.gpus} SIMULATED GPUs: one answer of {args.tokens} tokens {one:.2f} s; "
              f"{args.gpus} at once {together:.2f} s = {together / one:.2f}x (goal ≤ 1.2x for two); GPUs that "
              f"answered {sorted(a[3] for a in answers)}")
        r, whole, loop = rolling_switch_while_streaming(asker, cli, env, args.long)
        refused = sum(1 for a in loop if a[0] != 200)
        cut = sum(1 for a in loop if a[0] == 200 and not a[1])
        print(f"rolling `engine switch --profile balanced` (exit {r.returncode}) during a {args.long}-token answer: "
              f"{whole[2] if whole else 0} tokens, [DONE] {bool(whole and whole[1])} (goal: whole); client loop "
              f"{len(loop)} requests, refused {refused}, cut {cut} (goal: 0); answered per GPU "
              f"{ {g: sum(1 for a in loop if a[3] == str(g)) for g in range(args.gpus)} }")
        return 0
    finally:
        stop_all(procs)
        subprocess.run([*cli, "engine", "stop", "--gpu", "all"], capture_output=True, env=env, cwd=ROOT, timeout=120)
        import docker

        dc = docker.from_env()
        for c in dc.containers.list(all=True, filters={"label": [f"moet-panel.recipe={rid}"]}):
            c.remove(force=True)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
