"""What a Prometheus scrape costs the panel (docs/metrics.md#cost): scrape latency p50/p99 and the panel's
CPU with one scrape per second against no scraping, in the same run, alternating rounds; beside the
scrape's latency, that of the same server's cheapest answer (the gate's 421) as the machine's baseline.

    .venv/bin/python bench/metrics_scrape.py [--seconds 20] [--rounds 2]

A demo panel runs in a child process (SIMULATED engine started and ready, so every family has samples);
its CPU is read from /proc through psutil. Goals (issue 33): p99 ≤ 20 ms, ≤ 1% of a core added. On a
shared machine the CPU figure is noisy: the rounds alternate so drift hits both sides alike.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]


def serve(port: int, data_dir: str) -> None:
    """Child: the demo panel with its engine serving, until killed."""
    sys.path.insert(0, str(ROOT))
    from app.backend.recipe import SIMULATED_RECIPE
    from app.backend.config.settings import resolve_settings
    from app.backend.state import build_app_state
    from app.ui.app import build_ui, launch

    import signal

    # The simulated recipe with an id and an engine port of its own: another panel's demo engine on this
    # machine is never adopted, and this one's is stopped on SIGTERM (the finally below).
    engine_port = free_port()
    text = SIMULATED_RECIPE.read_text().replace('id = "simulated"', f'id = "bench-metrics-{engine_port}"')
    text = text.replace("port = 8000", f"port = {engine_port}").replace('"--port", "8000"', f'"--port", "{engine_port}"')
    text = text.replace('extends = "', f'extends = "{SIMULATED_RECIPE.parent}/')  # the copy lives elsewhere
    recipe = Path(data_dir) / "simulated-bench.toml"
    recipe.write_text(text)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    settings = resolve_settings(recipe, Path(data_dir) / "data", demo=True)
    settings.ensure_state_dir()
    state = build_app_state(settings)
    blocks = build_ui(state)
    launch(blocks, "127.0.0.1", port, state=state)
    state.engine.start("quality").wait(300)
    snap = state.engine.snapshot()
    print("ready" if snap.is_ready else f"engine {snap.state.value}: {snap.message}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        state.engine.stop().wait(60)
        state.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(proc: psutil.Process) -> float:
    """User + system CPU seconds of the panel process and its threads (children excluded: the engine)."""
    t = proc.cpu_times()
    return t.user + t.system


def measure(args: argparse.Namespace) -> int:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="moet-bench-metrics-", dir=Path.home()) as tmp:
        child = subprocess.Popen([sys.executable, __file__, "--serve", str(port), tmp], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            if line.strip() != "ready":
                print(f"the demo panel did not start (got {line!r})", file=sys.stderr)
                return 1
            proc = psutil.Process(child.pid)
            url = f"http://127.0.0.1:{port}/metrics"
            with httpx.Client(timeout=10) as client:
                deadline = time.monotonic() + 120
                while "moet_panel_engine_ready{model_name=\"deepseek-v4-flash\",simulated=\"1\"} 1.0" not in client.get(url).text:
                    if time.monotonic() > deadline:
                        print("the engine did not become ready", file=sys.stderr)
                        return 1
                    time.sleep(0.5)
                body = client.get(url).text
                for _ in range(5):  # warm the route and the connection
                    client.get(url)
                idle_cpu: list[float] = []
                busy_cpu: list[float] = []
                lat: list[float] = []
                base: list[float] = []  # the same server's cheapest answer: the gate's 421, no collector
                foreign = {"Host": f"elsewhere.example:{port}"}
                for _ in range(args.rounds):
                    for scraping in (False, True):
                        c0, t0 = cpu_s(proc), time.monotonic()
                        n = 0
                        while time.monotonic() - t0 < args.seconds:
                            s = time.perf_counter()
                            assert client.get(url, headers=foreign).status_code == 421  # every round alike
                            base.append((time.perf_counter() - s) * 1000)
                            if scraping:
                                s = time.perf_counter()
                                r = client.get(url)
                                lat.append((time.perf_counter() - s) * 1000)
                                assert r.status_code == 200
                            n += 1
                            time.sleep(max(0.0, t0 + n * 1.0 - time.monotonic()))  # one per second, on the second
                        share = (cpu_s(proc) - c0) / (time.monotonic() - t0) * 100
                        (busy_cpu if scraping else idle_cpu).append(share)
        finally:
            child.terminate()
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
    def pct(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    lat.sort()
    p50, p99 = statistics.median(lat), pct(lat, 0.99)
    idle, busy = statistics.mean(idle_cpu), statistics.mean(busy_cpu)
    print(f"scrape body: {len(body)} bytes, {sum(1 for ln in body.splitlines() if ln and ln[0] != '#')} samples")
    print(f"scrapes: {len(lat)} at 1/s over {args.rounds} rounds of {args.seconds:.0f} s (alternating with no scraping)")
    print(f"scrape latency   p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   max {lat[-1]:6.2f} ms   (goal p99 <= 20 ms: "
          f"{'met' if p99 <= 20 else 'NOT met'})")
    print(f"baseline (421)   p50 {statistics.median(base):6.2f} ms   p99 {pct(base, 0.99):6.2f} ms   max {max(base):6.2f} ms   "
          "(the same server's cheapest answer, sent every second in every round: the machine's share of the tail)")
    print(f"load average     {' '.join(f'{x:.1f}' for x in psutil.getloadavg())} on {psutil.cpu_count()} cores")
    print(f"panel CPU        no scraping {idle:5.2f}% of a core   1 scrape/s {busy:5.2f}%   added {busy - idle:+5.2f}%   "
          f"(goal <= 1%: {'met' if busy - idle <= 1 else 'NOT met'})")
    print(f"  per round      no scraping {', '.join(f'{v:.2f}' for v in idle_cpu)}   1 scrape/s {', '.join(f'{v:.2f}' for v in busy_cpu)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each round (default 20)")
    ap.add_argument("--rounds", type=int, default=2, help="pairs of (no scraping, 1 scrape/s) rounds (default 2)")
    ap.add_argument("--serve", nargs=2, metavar=("PORT", "DATA_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(int(args.serve[0]), args.serve[1])
        return 0
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
