"""Benchmark: the idle panel's CPU (issue 29), as `moet-panel serve --demo` runs it, in four states:

    .venv/bin/python bench/idle_cpu.py [--seconds 20] [--baseline REF] [--engine stopped|ready|both] [--no-browser]

  1. no browser, engine stopped        2. one browser tab per view (8 pages), engine stopped
  3. no browser, engine ready          4. one browser tab per view, engine ready (SIMULATED engine, Docker)

Prints the panel process's CPU as % of one core (user+system, psutil) per state, and where it goes: a
CPU-weighted stack sample of the panel's threads (bench/idle_cpu_probe.py; py-spy is not on this box).
Goal (issue 29): no browser + engine ready ≤ 2% of a core. Figures only, no assertion; the box is shared,
so run it more than once. `--baseline REF`: the same run for a git ref (REF's files in a temp
dir, from `git archive`) side by side, same machine, same minute.

The data dir is a fresh per-user demo dir under a temp XDG_DATA_HOME; the engine uses its own recipe id
and a free port (nothing of another panel is touched) and is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.panelproc import DemoPanel, recipe_copy  # noqa: E402
TABS = ["Profiles", "Downloads", "Engine", "Logs", "Telemetry", "Self-test", "Compare", "Chat"]


class Panel(DemoPanel):
    """The demo panel run under the stack probe (bench/idle_cpu_probe.py), its CPU measured from outside."""

    def __init__(self, root: Path, tmp: Path, recipe: Path) -> None:
        self.stacks = tmp / "stacks.json"
        super().__init__(root, tmp, recipe, argv=(sys.executable, str(ROOT / "bench" / "idle_cpu_probe.py"),
                                                  str(tmp / "stacks.json")))
        self.ps = psutil.Process(self.proc.pid)

    def stack_snapshot(self) -> tuple[int | None, dict[str, float]]:
        self.stacks.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not self.stacks.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        if not self.stacks.exists():
            return None, {}
        data = json.loads(self.stacks.read_text())
        return data["sampler_tid"], {r["stack"]: r["cpu_s"] for r in data["stacks"]}

    def cpu_s(self, leave_out: int | None) -> float:
        """The panel's CPU seconds so far, the bench's own sampler thread left out."""
        t = self.ps.cpu_times()
        own = next((th.user_time + th.system_time for th in self.ps.threads() if th.id == leave_out), 0.0)
        return t.user + t.system - own

    def measure(self, seconds: float) -> tuple[float, dict[str, float]]:
        sampler, before = self.stack_snapshot()
        t0, c0 = time.monotonic(), self.cpu_s(sampler)
        time.sleep(seconds)
        c1, t1 = self.cpu_s(sampler), time.monotonic()
        _, after = self.stack_snapshot()
        pct = 100 * (c1 - c0) / (t1 - t0)
        diff = {k: round(v - before.get(k, 0.0), 2) for k, v in after.items() if v - before.get(k, 0.0) > 0}
        return pct, diff

def open_views(pw: Any, url: str) -> Any:
    browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
    for tab in TABS:
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.goto(url)
        page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached", timeout=60_000)
        page.get_by_role("tab", name=tab).click()
    return browser


def run(root: Path, seconds: float, engines: tuple[str, ...] = ("stopped", "ready"),
        browser_too: bool = True) -> dict[str, tuple[float, dict[str, float]]]:
    from playwright.sync_api import sync_playwright

    results: dict[str, tuple[float, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="moet-idle-") as t:
        tmp = Path(t)
        recipe, rid = recipe_copy(root, tmp, f"bench-idle-{os.getpid()}")
        panel = Panel(root, tmp, recipe)
        try:
            time.sleep(5)  # start-up work settles
            with sync_playwright() as pw:
                for engine in engines:
                    if engine == "ready":
                        panel.cli("engine", "start", "--profile", "quality")
                        time.sleep(5)
                    results[f"no browser, engine {engine}"] = panel.measure(seconds)
                    if not browser_too:
                        continue
                    browser = open_views(pw, panel.url)
                    time.sleep(3)
                    results[f"{len(TABS)} browser tabs (one per view), engine {engine}"] = panel.measure(seconds)
                    browser.close()
        finally:
            panel.close(rid)  # its engine stopped and its containers removed first
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--baseline", metavar="REF", help="also measure this git ref (e.g. main) in the same run")
    ap.add_argument("--stacks", type=int, default=6, help="top stacks shown per state")
    ap.add_argument("--engine", choices=["stopped", "ready", "both"], default="both", help="engine states to measure")
    ap.add_argument("--no-browser", action="store_true", help="only the states without a browser")
    a = ap.parse_args()
    # a SIGTERM (timeout, Ctrl+C from a wrapper) still runs the clean-up: the panel and engine are stopped
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    sides = {"this tree": ROOT}
    base_dir = None
    if a.baseline:
        base_dir = Path(tempfile.mkdtemp(prefix="moet-idle-base-"))  # the ref's files (git archive), no worktree
        archive = subprocess.run(["git", "archive", a.baseline], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base_dir)], input=archive, check=True)
        sides = {f"baseline {a.baseline}": base_dir, "this tree": ROOT}
    try:
        engines = ("stopped", "ready") if a.engine == "both" else (a.engine,)
        table = {name: run(root, a.seconds, engines, not a.no_browser) for name, root in sides.items()}
    finally:
        if base_dir is not None:
            shutil.rmtree(base_dir, ignore_errors=True)
    print(f"\nidle panel CPU, % of one core over {a.seconds:.0f} s (shared {os.cpu_count()}-core box: noisy)")
    states = list(next(iter(table.values())))
    print(f"{'state':48s}" + "".join(f"{n:>22s}" for n in table))
    for st in states:
        print(f"{st:48s}" + "".join(f"{table[n][st][0]:21.1f}%" for n in table))
    print("goal: no browser + engine ready ≤ 2% of a core")
    for name, res in table.items():
        print(f"\nwhere it goes ({name}): CPU s per stack over the window")
        for st, (_, stacks) in res.items():
            print(f"  {st}:")
            for k, v in sorted(stacks.items(), key=lambda kv: -kv[1])[: a.stacks]:
                print(f"    {v:6.2f} s  {k[:150]}")


if __name__ == "__main__":
    main()
