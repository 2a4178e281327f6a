"""Benchmark: what an idle page receives, and how soon it shows an engine change (issue 32, "One writer,
events out": the UI renders on change, docs/engine.md "Who listens").

    .venv/bin/python bench/ui_push.py [--seconds 60] [--cycles 3] [--baseline REF]

The panel runs as `moet-panel serve --demo` (SIMULATED engine in Docker, its own recipe id and free ports,
data under ~/moet-try-ui-push-*). One headless Chromium page on the Engine tab. Measured per side:

  * idle page, engine ready and engine stopped: what the browser receives per minute, from Chromium's own
    network events (CDP `Network.dataReceived`: the body bytes of every response, Gradio's SSE stream
    included) and the event POSTs it sends; and the DOM updates per minute in the header strip and the Engine
    tab's state views (a MutationObserver: records per region, Gradio's own status tracker left out).
  * latency: Docker's own event time for the engine container (`start`, `die`) to the header and the Engine
    tab's badge showing `starting` / `stopped` (page clock, `Date.now()`); the engine is started and stopped
    by the CLI (`moet-panel engine start/stop` in a child process), `--cycles` times.

Figures only, no assertion; the box is shared. `--baseline REF`: the same run for a git ref (its files from
`git archive` in a folder under ~), side by side.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.panelproc import DemoPanel, recipe_copy  # noqa: E402

HOME_TMP = Path.home()

OBSERVER_JS = """() => {
  window.__moet = {muts: {header: 0, status: 0, diag: 0, log: 0}, seen: []};
  const regions = [['header', '#moet-header'], ['status', '#engine-status'], ['diag', '#engine-diagnosis-box'],
                   ['log', '#engine-log']];
  new MutationObserver(records => {
    for (const r of records) {
      // Gradio's own status tracker (div.wrap.default|center, its progress text) changes on every event, shown
      // or not: left out, only what the panel sends counts
      const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
      if (!el || el.closest('div.wrap.default, div.wrap.center')) continue;
      for (const [name, sel] of regions) {
        const el = document.querySelector(sel);
        if (el && el.contains(r.target)) { window.__moet.muts[name] += 1; break; }
      }
    }
    const h = document.querySelector('[data-testid="hdr-engine"]');
    const b = document.querySelector('[data-testid="engine-state"]');
    const now = Date.now() / 1000;
    const last = window.__moet.seen[window.__moet.seen.length - 1];
    const cur = [h ? h.dataset.state : '', b ? b.dataset.state : ''];
    if (!last || last[1] !== cur[0] || last[2] !== cur[1]) window.__moet.seen.push([now, cur[0], cur[1]]);
  }).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
}"""


class DockerTimes:
    """Docker's own time of each `start` / `die` of the recipe's containers (event timeNano)."""

    def __init__(self, rid: str) -> None:
        import docker

        self.times: list[tuple[str, float]] = []
        self._stream = docker.from_env().events(decode=True, filters={"label": f"moet-panel.recipe={rid}",
                                                                      "type": "container"})
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        try:
            for ev in self._stream:
                if ev.get("Action") in ("start", "die"):
                    self.times.append((ev["Action"], ev["timeNano"] / 1e9))
        except Exception:
            pass

    def last(self, action: str, after: float) -> float | None:
        hits = [t for a, t in self.times if a == action and t >= after]
        return hits[0] if hits else None

    def close(self) -> None:
        self._stream.close()


class Traffic:
    """Chromium's network events for one page (CDP): body bytes received, requests sent."""

    def __init__(self, page: Any) -> None:
        self.cdp = page.context.new_cdp_session(page)
        self.urls: dict[str, str] = {}
        self.reset()
        self.cdp.on("Network.requestWillBeSent", self._sent)
        self.cdp.on("Network.dataReceived", self._data)
        self.cdp.send("Network.enable")

    def reset(self) -> None:
        self.received = 0
        self.posts = 0
        self.post_bytes = 0

    def _sent(self, ev: dict[str, Any]) -> None:
        req = ev["request"]
        self.urls[ev["requestId"]] = req["url"]
        if req["method"] == "POST":
            self.posts += 1
            self.post_bytes += len(req.get("postData") or "")

    def _data(self, ev: dict[str, Any]) -> None:
        self.received += int(ev.get("dataLength", 0))


def idle_window(page: Any, traffic: Traffic, seconds: float) -> dict[str, float]:
    page.evaluate("() => { for (const k in window.__moet.muts) window.__moet.muts[k] = 0; }")
    traffic.reset()
    page.wait_for_timeout(seconds * 1000)  # pumps the CDP events meanwhile
    muts = page.evaluate("() => window.__moet.muts")
    per_min = 60.0 / seconds
    return {"KiB received/min": traffic.received * per_min / 1024, "event POSTs/min": traffic.posts * per_min,
            "KiB sent/min": traffic.post_bytes * per_min / 1024,
            **{f"DOM updates/min: {k}": v * per_min for k, v in muts.items()}}


def shown_at(page: Any, which: int, state: str, after: float, timeout: float = 30.0) -> float | None:
    """When the page first showed `state` (which: 1 header, 2 Engine tab badge) after `after` (page clock)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = page.evaluate("() => window.__moet.seen")
        hit = next((s[0] for s in seen if s[0] >= after and s[which] == state), None)
        if hit is not None:
            return float(hit)
        page.wait_for_timeout(100)
    return None


def run(root: Path, seconds: float, cycles: int) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    out: dict[str, Any] = {}
    tmp = Path(tempfile.mkdtemp(prefix="moet-try-ui-push-", dir=HOME_TMP))
    recipe, rid = recipe_copy(root, tmp, f"bench-push-{os.getpid()}-{tmp.name[-6:]}".replace("_", "-").lower(),
                              boot_s="1")
    panel = DemoPanel(root, tmp, recipe)
    docker_times = DockerTimes(rid)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
            page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            traffic = Traffic(page)
            page.goto(panel.url)
            page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached", timeout=60_000)
            page.get_by_role("tab", name="Engine").click()
            page.evaluate(OBSERVER_JS)
            page.wait_for_timeout(3000)
            out["idle, engine stopped"] = idle_window(page, traffic, seconds)
            lat: dict[str, list[float]] = {"header shows starting": [], "Engine tab shows starting": [],
                                           "header shows stopped": [], "Engine tab shows stopped": []}
            for i in range(cycles):
                t0 = time.time()
                panel.cli("engine", "start", "--profile", "quality")
                started = docker_times.last("start", t0 - 1)
                if started is not None:
                    for which, name in ((1, "header shows starting"), (2, "Engine tab shows starting")):
                        at = shown_at(page, which, "starting", started - 0.5)
                        if at is not None:
                            lat[name].append(at - started)
                if i == 0:
                    page.wait_for_timeout(3000)
                    out["idle, engine ready"] = idle_window(page, traffic, seconds)
                t0 = time.time()
                panel.cli("engine", "stop")
                died = docker_times.last("die", t0 - 1)
                if died is not None:
                    for which, name in ((1, "header shows stopped"), (2, "Engine tab shows stopped")):
                        at = shown_at(page, which, "stopped", died - 0.5)
                        if at is not None:
                            lat[name].append(at - died)
            out["latency"] = lat
            browser.close()
    finally:
        docker_times.close()
        panel.close(rid)  # its engine stopped and its containers removed first
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="each idle window")
    ap.add_argument("--cycles", type=int, default=3, help="CLI start/stop cycles for the latency")
    ap.add_argument("--baseline", metavar="REF", help="also measure this git ref (e.g. main) in the same run")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    sides = {"this tree": ROOT}
    base_dir = None
    if a.baseline:
        base_dir = Path(tempfile.mkdtemp(prefix="moet-try-ui-push-base-", dir=HOME_TMP))
        archive = subprocess.run(["git", "archive", a.baseline], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base_dir)], input=archive, check=True)
        sides = {f"baseline {a.baseline}": base_dir, "this tree": ROOT}
    try:
        table = {name: run(root, a.seconds, a.cycles) for name, root in sides.items()}
    finally:
        if base_dir is not None:
            shutil.rmtree(base_dir, ignore_errors=True)
    names = list(table)
    print(f"\nidle page (Engine tab open), per minute over {a.seconds:.0f} s windows")
    print(f"{'':42s}" + "".join(f"{n:>22s}" for n in names))
    for window in ("idle, engine stopped", "idle, engine ready"):
        print(window)
        for key in table[names[0]][window]:
            print(f"  {key:40s}" + "".join(f"{table[n][window][key]:22.1f}" for n in names))
    print("latency, Docker event -> page shows it, s: median (min-max, n)")
    for key in table[names[0]]["latency"]:
        cells = []
        for n in names:
            v = table[n]["latency"][key]
            cells.append(f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}, {len(v)})" if v else "-")
        print(f"  {key:40s}" + "".join(f"{c:>22s}" for c in cells))


if __name__ == "__main__":
    main()
