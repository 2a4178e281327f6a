"""Benchmark: what watching the page costs (issue 42): Chromium (all its processes) and the panel process,
as % of one core, per tab while idle and while an answer streams in Chat, engine ready.

    .venv/bin/python bench/page_cost.py [--seconds 15] [--floor-seconds 5] [--baseline REF]
                                         [--tabs Profiles,Telemetry,...] [--no-chat] [--three]

The panel runs as `moet-panel serve --demo` (SIMULATED engine in real Docker, its own recipe id and free
ports, data under ~/moet-page-cost-*), the engine started by the CLI and waited for (the header shows
`ready`). One headless Chromium (Debian's `chromium`); for each row a fresh page opens, shows the tab,
settles for 3 s, then the CPU of every Chromium process (psutil over the process tree, processes that come
and go included) and of the panel process are read over `--seconds`. Rows:

  * blank page (about:blank): the floor, same browser, same minute — measured again (`--floor-seconds`)
    just before every row and printed beside it (issue 49: a shared box's load moves the floor too);
  * one row per tab, idle;
  * `Chat, answer streaming`: a long prompt sent, measured while the answer streams (the window is cut
    at the answer's end, and its length printed);
  * `--three`: three pages on Profiles at once (the panel's cost with three pages open).

`--baseline REF`: the same run for a git ref (its files from `git archive` in a folder under ~), side by
side, same machine, same minute. Figures only, no assertion; the box is shared: the load (`uptime`) is
printed with each side. Goals (issue 49): Chromium ≤ 3 % per idle tab, ≤ 6 % Telemetry; the panel ≤ 2 % with
one page (issue 42's: ≤ 25 % while an answer streams, the panel ≤ 5 % with three pages).
"""

from __future__ import annotations

import argparse
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

from bench.panelproc import DemoPanel, free_port, recipe_copy  # noqa: E402

TABS = ["Profiles", "Downloads", "Engine", "Logs", "Telemetry", "Self-test", "Compare", "Access", "Service", "Chat"]
PROMPT = ("Write a long, detailed explanation of how a mixture-of-experts model routes tokens to experts, "
          "with examples, in at least twenty paragraphs.")


def load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


class CpuMeter:
    """CPU seconds of a process tree (or one process), summed over every process seen: a process that ended
    between two reads keeps what it had used when last seen."""

    def __init__(self, root_pid: int, tree: bool, name_has: str = "") -> None:
        self.root, self.tree, self.name_has = root_pid, tree, name_has
        self.seen: dict[tuple[int, float], float] = {}

    def _procs(self) -> list[psutil.Process]:
        root = psutil.Process(self.root)
        procs = [root] + (root.children(recursive=True) if self.tree else [])
        return [p for p in procs if not self.name_has or self.name_has in p.name().lower()]

    def read(self) -> float:
        for p in self._procs():
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    self.seen[(p.pid, p.create_time())] = t.user + t.system
            except psutil.Error:
                continue
        return sum(self.seen.values())


def open_page(browser: Any, url: str, tab: str | None) -> Any:
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    if tab is None:
        page.goto("about:blank")
        return page
    page.goto(url)
    page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached", timeout=60_000)
    page.wait_for_selector('[data-testid="hdr-engine"][data-state="ready"]', state="attached", timeout=120_000)
    page.get_by_role("tab", name=tab, exact=True).click()
    return page


def measure(chromium: CpuMeter, panel: CpuMeter, seconds: float, until: Any = None) -> tuple[float, float, float]:
    """(Chromium %, panel %, seconds measured); `until()` true ends the window early."""
    t0, c0, p0 = time.monotonic(), chromium.read(), panel.read()
    deadline = t0 + seconds
    while time.monotonic() < deadline:
        time.sleep(0.25)
        if until is not None and until():
            break
    t1, c1, p1 = time.monotonic(), chromium.read(), panel.read()
    dt = t1 - t0
    return 100 * (c1 - c0) / dt, 100 * (p1 - p0) / dt, dt


def chat_streaming(browser: Any, url: str, chromium: CpuMeter, panel: CpuMeter, seconds: float) -> tuple[float, float, float]:
    page = open_page(browser, url, "Chat")
    page.wait_for_function("() => document.querySelector('#chat-banner')?.innerText.includes('Engine ready')",
                           timeout=60_000)
    time.sleep(2)
    page.fill("#chat-input textarea", PROMPT)
    page.press("#chat-input textarea", "Enter")
    page.wait_for_function("() => (document.querySelector('#chat-bot .message.bot, #chat-bot .bot')?.innerText || '')"
                           ".trim().length > 0", timeout=60_000)
    last = {"text": -1, "t": time.monotonic()}

    def done() -> bool:  # no new text for 2 s: the answer ended
        n = page.evaluate("() => (document.querySelector('#chat-bot')?.innerText || '').length")
        now = time.monotonic()
        if n != last["text"]:
            last.update(text=n, t=now)
        return now - last["t"] > 2.0

    got = measure(chromium, panel, seconds, until=done)
    page.context.close()
    return got


Row = tuple[float, float, float, float]  # Chromium %, panel %, seconds, the blank page's Chromium % just before


def run(root: Path, seconds: float, tabs: list[str], chat: bool, three: bool, floor_s: float) -> dict[str, Row]:
    from playwright.sync_api import sync_playwright

    results: dict[str, Row] = {}
    with tempfile.TemporaryDirectory(prefix="moet-page-cost-", dir=Path.home()) as t:
        tmp = Path(t)
        recipe, rid = recipe_copy(root, tmp, f"bench-page-{os.getpid()}-{free_port()}")
        panel = DemoPanel(root, tmp, recipe)
        try:
            panel.cli("engine", "start", "--profile", "quality")
            panel_cpu = CpuMeter(panel.proc.pid, tree=False)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
                chromium = CpuMeter(os.getpid(), tree=True, name_has="chrom")
                def floor() -> float:  # the blank page, measured just before a row (after the last page's teardown)
                    page = open_page(browser, panel.url, None)
                    time.sleep(3)
                    got = measure(chromium, panel_cpu, floor_s)[0]
                    page.context.close()
                    return got

                try:
                    page = open_page(browser, panel.url, None)
                    time.sleep(3)
                    blank = measure(chromium, panel_cpu, seconds)
                    results["blank page (floor)"] = (*blank, blank[0])
                    page.context.close()
                    for tab in tabs:
                        f = floor()
                        page = open_page(browser, panel.url, tab)
                        time.sleep(3)
                        results[f"{tab}, idle"] = (*measure(chromium, panel_cpu, seconds), f)
                        page.context.close()
                    if three:
                        f = floor()
                        pages = [open_page(browser, panel.url, "Profiles") for _ in range(3)]
                        time.sleep(3)
                        results["3 pages on Profiles, idle"] = (*measure(chromium, panel_cpu, seconds), f)
                        for p in pages:
                            p.context.close()
                    if chat:
                        f = floor()
                        results["Chat, answer streaming"] = (*chat_streaming(browser, panel.url, chromium, panel_cpu,
                                                                             max(seconds, 30.0)), f)
                finally:
                    browser.close()
        finally:
            panel.close(rid)  # its engine stopped and its containers removed first
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--floor-seconds", type=float, default=5.0, help="the blank page measured before each row")
    ap.add_argument("--baseline", metavar="REF", help="also measure this git ref (e.g. main) in the same run")
    ap.add_argument("--tabs", default=",".join(TABS), help="comma-separated tab names")
    ap.add_argument("--no-chat", action="store_true", help="leave out the streaming-answer row")
    ap.add_argument("--three", action="store_true", help="also three pages on Profiles at once")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    tabs = [x.strip() for x in a.tabs.split(",") if x.strip()]
    sides: dict[str, Path] = {"this tree": ROOT}
    base_dir = None
    if a.baseline:
        base_dir = Path(tempfile.mkdtemp(prefix="moet-page-cost-base-", dir=Path.home()))
        archive = subprocess.run(["git", "archive", a.baseline], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base_dir)], input=archive, check=True)
        sides = {f"baseline {a.baseline}": base_dir, "this tree": ROOT}
    table: dict[str, dict[str, Row]] = {}
    loads: dict[str, str] = {}
    try:
        for name, root in sides.items():
            before = load()
            table[name] = run(root, a.seconds, tabs, not a.no_chat, a.three, a.floor_seconds)
            loads[name] = f"{before} → {load()}"
    finally:
        if base_dir is not None:
            shutil.rmtree(base_dir, ignore_errors=True)
    print(f"\npage cost, % of one core over {a.seconds:.0f} s per row (shared {os.cpu_count()}-core box: noisy)")
    for name, ld in loads.items():
        print(f"  {name}: {ld}")
    rows = list(next(iter(table.values())))
    print(f"{'row':30s}" + "".join(f"{n[:40]:>42s}" for n in table))
    print(f"{'':30s}" + "".join(f"{'Chromium':>14s}{'floor':>14s}{'panel':>14s}" for _ in table))
    for r in rows:
        cells = ""
        for n in table:
            c, p, dt, fl = table[n].get(r, (float("nan"),) * 4)
            cells += f"{c:13.1f}%{fl:13.1f}%{p:13.1f}%"
        print(f"{r:30s}{cells}")
    if "Chat, answer streaming" in rows:
        print("  (streaming row measured over " + ", ".join(
            f"{n}: {table[n]['Chat, answer streaming'][2]:.0f} s" for n in table) + ")")
    print("floor: the blank page's Chromium % measured just before that row (same browser, same minute)")
    print("goals (issue 49): Chromium ≤ 3 % per idle tab, ≤ 6 % Telemetry; panel ≤ 2 % (one page); "
          "(issue 42) ≤ 25 % streaming, panel ≤ 5 % (three pages)")


if __name__ == "__main__":
    main()
