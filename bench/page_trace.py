"""Benchmark: where an idle tab's time goes in Chromium (issue 49 item 3), from a DevTools performance trace.

    .venv/bin/python bench/page_trace.py [--seconds 15] [--tabs Profiles,Engine,Telemetry,Chat] [--save DIR]

The panel runs as `moet-panel serve --demo` (bench/panelproc.py: SIMULATED engine in Docker, started by the
CLI and waited for). One headless Chromium; for each tab a fresh page opens, shows the tab, settles 3 s,
then over `--seconds`:

  * CDP `Performance.getMetrics` before and after: the renderer's task, script, style and layout time and
    counts (the page's own main thread);
  * a CDP trace (`Tracing.start`, the devtools timeline categories): the main thread's time by top-level task
    kind (timer, feed message, animation frame, style, layout, paint, ...), and the compositor's frames;
  * what the page did: DOM mutation records (where: the header, the plots, Gradio's status trackers, else),
    requests sent (CDP `Network.requestWillBeSent`), feed messages received.

`--save DIR` keeps each row's raw trace (JSON, Chrome's trace format: open it in chrome://tracing or Perfetto).
Figures only, no assertion.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.page_cost import load, open_page  # noqa: E402
from bench.panelproc import DemoPanel, free_port, recipe_copy  # noqa: E402

CATEGORIES = ",".join(["devtools.timeline", "disabled-by-default-devtools.timeline", "v8.execute", "blink",
                       "cc", "viz", "toplevel", "disabled-by-default-devtools.timeline.frame"])

# Where a page's DOM writes land (a MutationObserver; each record's target is matched in this order).
WATCH_JS = """() => {
  const where = [['header', '#moet-header'], ['plots', '#telemetry-plots'], ['gradio status', '.wrap, .progress-text, .eta-bar'],
                 ['tabs', '#main-tabs']];
  window.__trace = {mutations: {}, feed: 0};
  new MutationObserver(records => {
    for (const r of records) {
      const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
      let k = 'else';
      for (const [name, sel] of where) if (el && el.closest(sel)) { k = name; break; }
      window.__trace.mutations[k] = (window.__trace.mutations[k] || 0) + 1;
    }
  }).observe(document, {subtree: true, childList: true, characterData: true, attributes: true});
}"""

# The main thread's top-level tasks are classified by the first known event inside them.
KINDS = [("TimerFire", "timer"), ("FireAnimationFrame", "animation frame"), ("EventDispatch", "DOM event"),
         ("FunctionCall", "script (callback)"), ("v8.run", "script (callback)"), ("EvaluateScript", "script (load)"),
         ("ParseHTML", "parse HTML"), ("UpdateLayoutTree", "style"), ("Layout", "layout"), ("PrePaint", "paint"),
         ("Paint", "paint"), ("Layerize", "paint"), ("HitTest", "hit test")]


def summarize(events: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Per-second figures of the renderer's main thread ("CrRendererMain") from the trace's complete events."""
    names: dict[tuple[int, int], str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
    mains = {k for k, v in names.items() if v == "CrRendererMain"}
    # the renderer whose main thread did the most work is the page's (about:blank and the browser have others)
    busy: Counter[tuple[int, int]] = Counter()
    for e in events:
        if (e.get("pid"), e.get("tid")) in mains and e.get("ph") == "X" and e.get("name") == "RunTask":
            busy[(e["pid"], e["tid"])] += e.get("dur", 0)
    if not busy:
        return {"note": "no renderer tasks in the trace"}
    main = busy.most_common(1)[0][0]
    mine = sorted((e for e in events if (e.get("pid"), e.get("tid")) == main and e.get("ph") == "X"),
                  key=lambda e: (e["ts"], -e.get("dur", 0)))
    tasks = [e for e in mine if e["name"] == "RunTask"]
    by_kind: dict[str, float] = defaultdict(float)
    n_kind: Counter[str] = Counter()
    inner: dict[str, float] = defaultdict(float)  # every inner event kind's total (nested ones counted apart)
    i = 0
    for t in tasks:
        end = t["ts"] + t.get("dur", 0)
        kind = "other"
        j = i
        while j < len(mine) and mine[j]["ts"] < t["ts"]:
            j += 1
        i = j
        first = None
        while j < len(mine) and mine[j]["ts"] <= end:
            e = mine[j]
            if e is not t and e["name"] != "RunTask":
                inner[e["name"]] += e.get("dur", 0)
                if first is None:
                    first = next((k for n, k in KINDS if n == e["name"]), None)
            j += 1
        kind = first or "other"
        by_kind[kind] += t.get("dur", 0)
        n_kind[kind] += 1
    frames = sum(1 for e in events if e.get("name") in ("DrawFrame", "Graphics.Pipeline") and e.get("ph") in ("X", "b"))
    ms_s = 1000.0 * seconds
    return {
        "main thread busy, ms/s": round(sum(t.get("dur", 0) for t in tasks) / ms_s, 2),
        "tasks/s": round(len(tasks) / seconds, 1),
        "by task kind, ms/s (tasks/s)": {k: f"{v / ms_s:.2f} ({n_kind[k] / seconds:.1f})"
                                         for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "inner events, ms/s": {k: round(v / ms_s, 2) for k, v in
                               sorted(inner.items(), key=lambda kv: -kv[1])[:14]},
        "frames/s (compositor)": round(frames / seconds, 1),
    }


def trace_tab(browser: Any, url: str, tab: str, seconds: float, save: Path | None) -> dict[str, Any]:
    page = open_page(browser, url, tab)
    page.evaluate(WATCH_JS)
    time.sleep(3)
    cdp = page.context.new_cdp_session(page)
    requests: Counter[str] = Counter()
    cdp.on("Network.requestWillBeSent",
           lambda ev: requests.update([ev["request"]["url"].split("?")[0].replace(url, "")]))
    cdp.send("Network.enable")
    cdp.send("Performance.enable")
    chunks: list[dict[str, Any]] = []
    done = {"v": False}
    cdp.on("Tracing.dataCollected", lambda ev: chunks.extend(ev["value"]))
    cdp.on("Tracing.tracingComplete", lambda ev: done.update(v=True))
    before = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    page.evaluate("() => { window.__trace.mutations = {}; window.__trace.feedAt = "
                  "Object.values(window.__moetFeed ? window.__moetFeed.pressed : {}).reduce((a, b) => a + b, 0); }")
    cdp.send("Tracing.start", {"categories": CATEGORIES, "transferMode": "ReportEvents"})
    t0 = time.monotonic()
    page.wait_for_timeout(seconds * 1000)  # pumps the CDP events meanwhile
    cdp.send("Tracing.end")
    dt = time.monotonic() - t0
    deadline = time.monotonic() + 60
    while not done["v"] and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    after = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
    seen = page.evaluate("() => window.__trace")
    pressed = page.evaluate("() => window.__moetFeed ? window.__moetFeed.pressed : {}")
    if save is not None:
        (save / f"{tab.lower().replace(' ', '-')}.trace.json").write_text(json.dumps({"traceEvents": chunks}))
    page.context.close()
    metric = {k: after.get(k, 0) - before.get(k, 0) for k in ("TaskDuration", "ScriptDuration", "RecalcStyleDuration",
                                                             "LayoutDuration", "RecalcStyleCount", "LayoutCount")}
    return {
        "seconds": round(dt, 1),
        "Performance.getMetrics per s": {
            "task ms": round(1000 * metric["TaskDuration"] / dt, 2),
            "script ms": round(1000 * metric["ScriptDuration"] / dt, 2),
            "style ms": round(1000 * metric["RecalcStyleDuration"] / dt, 2),
            "layout ms": round(1000 * metric["LayoutDuration"] / dt, 2),
            "style recalcs": round(metric["RecalcStyleCount"] / dt, 2),
            "layouts": round(metric["LayoutCount"] / dt, 2),
        },
        "trace": summarize(chunks, dt),
        "DOM mutation records": seen["mutations"],
        "requests sent": dict(requests),
        "feed redraws asked (trigger presses)": pressed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--tabs", default="Profiles,Engine,Telemetry,Chat")
    ap.add_argument("--save", type=Path, help="keep each row's raw trace in this folder")
    ap.add_argument("--url", help="an already running panel (engine ready) instead of a fresh demo panel")
    a = ap.parse_args()
    tabs = [x.strip() for x in a.tabs.split(",") if x.strip()]
    if a.save:
        a.save.mkdir(parents=True, exist_ok=True)
    from playwright.sync_api import sync_playwright

    out: dict[str, Any] = {"load before": load()}
    with tempfile.TemporaryDirectory(prefix="moet-page-trace-", dir=Path.home()) as t:
        panel = rid = None
        if a.url:
            url = a.url
        else:
            recipe, rid = recipe_copy(ROOT, Path(t), f"bench-trace-{os.getpid()}-{free_port()}")
            panel = DemoPanel(ROOT, Path(t), recipe)
            url = panel.url
        try:
            if panel is not None:
                panel.cli("engine", "start", "--profile", "quality")
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
                try:
                    for tab in tabs:
                        out[tab] = trace_tab(browser, url, tab, a.seconds, a.save)
                finally:
                    browser.close()
        finally:
            if panel is not None:
                panel.close(rid)
    out["load after"] = load()
    print(json.dumps(out, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
