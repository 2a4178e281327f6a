"""Benchmark: the panel's chat end to end vs the engine directly, against the SIMULATED engine.

    .venv/bin/python bench/chat_stream.py [--tokens 20000] [--tok-s 200] [--ttft-runs 20] [--only ttft|long]

Processes: the simulated engine, the panel (Chat tab only, launched as `moet-panel serve` launches
it: theme, HTTP gate), headless Chromium on the panel page, and this
driver, which also streams the same requests from the engine directly (openai SDK). Prints:

* TTFT added by the panel, p50: (first token visible in the browser after Send) − (first token
  from the engine directly), same prompt, runs interleaved, through Gradio's own streaming event —
  next to Gradio's own floor measured in the same run on the same page: a one-yield Chatbot event
  (click → its text on screen). Goal: the added TTFT within 10 ms of that floor (issue 15). Both
  sides are timed inside the page, so no Playwright round trip or polling is charged to the panel:
    - start: `performance.now()` when the trusted click on Send (Playwright's mouse click through
      CDP) reaches the page: a capturing `click` listener on `window`, which runs before any of the
      page's own. The browser's own input latency before that (event `timeStamp` → dispatch) is
      printed separately, not counted;
    - end: `performance.now()` in a MutationObserver callback on `#chat-bot` for the first added
      node (or changed text) that contains the first token's text (the sim is deterministic per
      prompt, so it is the first delta of the direct stream) and has a layout box
      (`getClientRects()`); i.e. the token is in the chat's DOM, displayed, before the next paint;
    - direct: the driver's `ChatStream` on a fresh `EngineClient` (its own TCP connect), first
      reasoning/answer delta − just before the request.
* tokens lost on a long answer (target 0): panel text vs the direct stream of the same request
  (the simulated engine is deterministic per prompt), run side by side.
* panel process CPU during the long answer (target ≤ 25 % of one core).
* cost of the last 1k tokens' updates vs the first 1k (target ≤ 1.5×): panel CPU and browser
  main-thread time per 1k tokens.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.panelproc import stop_all  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 180.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"bench: {url} did not come up in {timeout}s")


# ---- the panel process ------------------------------------------------------------------------------


def serve_panel(engine_url: str, port: int, data_dir: str) -> None:
    import app.ui.app as ui_app
    from app.backend.chat.conversations import ChatService
    from app.backend.contracts import EngineSnapshot, EngineState
    from app.backend.config.settings import resolve_settings
    from app.backend.state import AppState

    settings = resolve_settings(demo=True, data_dir=data_dir)
    snap = EngineSnapshot(state=EngineState.READY, profile_id="quality", base_url=engine_url,
                          served_name=settings.recipe.model.served_name, simulated=True)
    state = AppState(settings=settings)
    state.chat = ChatService(settings.recipe, settings.ensure_state_dir(), snapshot_fn=lambda: snap,
                             extra_body={"ignore_eos": True})  # the sim then runs to max_tokens
    ui_app.TABS[:] = ["app.ui.chat"]
    blocks = ui_app.build_ui(state)
    with blocks:  # Gradio's own floor: the cheapest streamed Chatbot event, same page, same queue settings
        import gradio as gr

        floor_bot = gr.Chatbot(elem_id="bench-floor-bot", height=120)
        floor_btn = gr.Button("bench floor", elem_id="bench-floor-go")
        floor_in = gr.Textbox(elem_id="bench-floor-in")

        def floor(text: str):
            yield [{"role": "user", "content": text},
                   {"role": "assistant", "content": "tok" + text, "metadata": {"title": "Thinking", "status": "pending"}}]

        floor_btn.click(floor, floor_in, floor_bot, concurrency_id="bench-floor", concurrency_limit=8,
                        show_progress="hidden")
    ui_app.launch(blocks, "127.0.0.1", port)  # as `moet-panel serve` does: theme, the HTTP gate
    print("PANEL READY", flush=True)
    threading.Event().wait()


# ---- driver ------------------------------------------------------------------------------------------


def direct(engine_url: str, model: str, prompt: str, max_tokens: int) -> tuple[float, str, str, int, str]:
    """Stream the same request from the engine: (TTFT s, thinking, answer, completion tokens, first delta)."""
    from app.backend.chat.client import ChatRequest, ChatStream, SamplingParams
    from app.backend.chat.events import ContentDelta, ReasoningDelta, UsageReport
    from app.backend.engine.runtime.client import EngineClient

    client = EngineClient(engine_url)
    req = ChatRequest(model, [{"role": "user", "content": prompt}], SamplingParams(1.0, 1.0, 0.05, max_tokens),
                      {"ignore_eos": True})
    t0 = time.perf_counter()
    first = None
    first_text = ""
    thinking: list[str] = []
    answer: list[str] = []
    tokens = 0
    for ev in ChatStream(client, req):
        if isinstance(ev, (ReasoningDelta, ContentDelta)):
            if first is None:
                first, first_text = time.perf_counter() - t0, ev.text
            (thinking if isinstance(ev, ReasoningDelta) else answer).append(ev.text)
        elif isinstance(ev, UsageReport):
            tokens = ev.completion_tokens
    client.close()
    return first or float("nan"), "".join(thinking), "".join(answer), tokens, first_text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=20000, help="length of the long answer")
    ap.add_argument("--tok-s", type=float, default=200.0, help="simulated decode rate")
    ap.add_argument("--ttft-runs", type=int, default=20)
    ap.add_argument("--only", choices=["ttft", "long"], help="run one part only")
    ap.add_argument("--serve-panel", nargs=3, metavar=("ENGINE_URL", "PORT", "DATA_DIR"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_panel:
        serve_panel(args.serve_panel[0], int(args.serve_panel[1]), args.serve_panel[2])
        return 0

    import psutil

    from app.backend.recipe import SIMULATED_RECIPE, load_recipe

    model = load_recipe(SIMULATED_RECIPE).model.served_name
    env = {**os.environ, "MOET_SIM_DECODE_TOK_S": str(args.tok_s), "MOET_SIM_BOOT_S": "0",
           "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(ROOT)}
    sim_port, panel_port = free_port(), free_port()
    engine_url, panel_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{panel_port}"
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="moet-bench-chat-") as tmp:
        try:
            procs.append(subprocess.Popen([sys.executable, "-m", "app.backend.simengine", "--port", str(sim_port),
                                           "--served-model-name", model], env=env, cwd=ROOT,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_http(engine_url + "/health")
            panel = subprocess.Popen([sys.executable, __file__, "--serve-panel", engine_url, str(panel_port), tmp],
                                     env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs.append(panel)
            wait_http(panel_url + "/")
            return run_bench(args, engine_url, panel_url, model, psutil.Process(panel.pid), tmp)
        finally:
            stop_all(procs)  # only the processes this bench started


def cpu_s(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


# Armed before a click: resolves window.__benchFirst with ms from the click on `go` reaching the
# page (window capture phase, before any of the page's listeners) to the first added node / changed
# text under `root` that holds `tok` and has a layout box. No polling: the observer runs in the page
# at the mutation.
JS_ARM_FIRST_TOKEN = """
({root, go, tok}) => {
  const box = document.querySelector(root);
  window.__benchFirst = new Promise((resolve, reject) => {
    let t0 = null;
    const onClick = (e) => {
      if (t0 !== null || !(e.target.closest && e.target.closest(go))) return;
      t0 = performance.now();
      window.__benchInputLag = t0 - e.timeStamp;  // the browser's input plumbing before the page hears of it
    };
    window.addEventListener('click', onClick, true);
    const shows = (n) => {
      const el = n.nodeType === Node.TEXT_NODE ? n.parentElement : n;
      return !!el && el.nodeType === Node.ELEMENT_NODE && el.textContent.includes(tok) && el.getClientRects().length > 0;
    };
    const obs = new MutationObserver((records) => {
      if (t0 === null) return;
      for (const m of records) {
        const nodes = m.type === 'characterData' ? [m.target] : Array.from(m.addedNodes);
        if (nodes.some(shows)) {
          const t = performance.now();
          obs.disconnect();
          window.removeEventListener('click', onClick, true);
          resolve(t - t0);
          return;
        }
      }
    });
    obs.observe(box, {childList: true, subtree: true, characterData: true});
    setTimeout(() => { obs.disconnect(); reject(new Error('first token not on screen within 30 s')); }, 30000);
  });
}
"""
JS_LIVE_LINE = "() => { const s = document.querySelectorAll('#chat-bot sub'); return s.length ? s[s.length - 1].innerText : ''; }"
JS_ANSWER_TEXT = """
() => Array.from(document.querySelectorAll('#chat-bot [data-testid=bot]'))
  .filter(el => !el.querySelector('.thought-group') && !el.querySelector('sub'))
  .map(el => el.innerText).join(' ')
"""


class BrowserDriver:
    def __init__(self, pw, url: str):
        self.browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
        self.page = self.browser.new_page(viewport={"width": 1280, "height": 900})
        self.page.set_default_timeout(60_000)
        self.page.goto(url)
        self.page.wait_for_function("() => document.querySelector('#chat-banner')?.innerText.includes('Engine ready')")
        self.page.get_by_text("Sampling and system prompt").click()
        self.cdp = self.page.context.new_cdp_session(self.page)
        self.cdp.send("Performance.enable")
        self.input_lag_ms: list[float] = []

    def task_s(self) -> float:
        """Cumulative busy time of the page's main thread (script, style, layout, paint)."""
        metrics = self.cdp.send("Performance.getMetrics")["metrics"]
        return next(m["value"] for m in metrics if m["name"] == "TaskDuration")

    def new_chat(self, max_tokens: int) -> None:
        self.page.click("#chat-new")
        self.page.wait_for_function("() => !document.querySelector('#chat-bot [data-testid=bot]')")
        self.page.fill("#chat-max-tokens input", str(max_tokens))
        self.page.locator("#chat-max-tokens input").press("Tab")

    def timed_click(self, root: str, go: str, tok: str) -> float:
        """Click `go` (trusted mouse events); seconds from the click to `tok` shown under `root`."""
        self.page.evaluate(JS_ARM_FIRST_TOKEN, {"root": root, "go": go, "tok": tok})
        self.page.click(go)
        ms = self.page.evaluate("() => window.__benchFirst")
        self.input_lag_ms.append(self.page.evaluate("() => window.__benchInputLag"))
        return ms / 1000

    def send_timed(self, prompt: str, first_token: str) -> float:
        """Send; seconds from the click to the first token on screen."""
        self.page.fill("#chat-input textarea", prompt)
        return self.timed_click("#chat-bot", "#chat-send", first_token)

    def floor_timed(self, i: int) -> float:
        self.page.fill("#bench-floor-in textarea", f"f{i}")
        return self.timed_click("#bench-floor-bot", "#bench-floor-go", f"tokf{i}")

    def wait_done(self, timeout_ms: int = 600_000) -> str:
        self.page.wait_for_function("() => Array.from(document.querySelectorAll('#chat-bot sub'))"
                                    ".some(s => /profile \\S+ · TTFT/.test(s.innerText))", timeout=timeout_ms)
        return self.page.evaluate(JS_LIVE_LINE)

    def live_tokens(self) -> int | None:
        m = re.search(r"(\d+) tokens", self.page.evaluate(JS_LIVE_LINE))
        return int(m.group(1)) if m else None


def stored_reply(data_dir: str) -> tuple[str, str]:
    db = sqlite3.connect(str(Path(data_dir) / ".moet-panel" / "chat.sqlite"))
    row = db.execute("SELECT reasoning, content FROM messages WHERE role='assistant' ORDER BY id DESC LIMIT 1").fetchone()
    db.close()
    return row[0], row[1]


def run_bench(args: argparse.Namespace, engine_url: str, panel_url: str, model: str, panel_proc, data_dir: str) -> int:
    from playwright.sync_api import sync_playwright

    print(f"simulated engine {engine_url} at {args.tok_s:g} tok/s; panel {panel_url} (pid {panel_proc.pid}); "
          f"driven by headless Chromium; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    with sync_playwright() as pw:
        drv = BrowserDriver(pw, panel_url)
        try:
            if args.only != "long":
                ttft(args, drv, engine_url, model)
            if args.only != "ttft":
                long_answer(args, drv, engine_url, model, panel_proc, data_dir)
        finally:
            drv.browser.close()
    return 0


def server_side(engine_url: str, runs: int) -> tuple[float, float]:
    """The chat code's own latency, in this process: send() until the request leaves, and first
    token arrival until its frame is rendered (p50 ms)."""
    from app.backend.chat.client import SamplingParams
    from app.backend.chat.conversations import ChatService
    from app.backend.contracts import EngineSnapshot, EngineState
    from app.backend.recipe import SIMULATED_RECIPE, load_recipe
    from app.ui.chat import render_history, render_live

    recipe = load_recipe(SIMULATED_RECIPE)
    snap = EngineSnapshot(state=EngineState.READY, profile_id="quality", base_url=engine_url,
                          served_name=recipe.model.served_name, simulated=True)
    pre, post = [], []
    with tempfile.TemporaryDirectory() as tmp:
        svc = ChatService(recipe, Path(tmp), snapshot_fn=lambda: snap, extra_body={"ignore_eos": True})
        try:
            for i in range(runs + 1):
                conv = svc.new_conversation()
                t0 = time.monotonic()
                turn = svc.send(conv.id, f"server-side probe {i}", SamplingParams(1.0, 1.0, 0.05, 8))
                prefix = render_history(svc.get(conv.id).messages[:-1])
                for view in turn.follow():
                    frame = prefix + render_live(view)
                    if view.tokens and frame:
                        t_frame = time.monotonic()
                        break
                turn.done.wait(10)
                if i:
                    pre.append(1000 * (turn._rec.started - t0))
                    post.append(1000 * (t_frame - turn._rec.first_token))
        finally:
            svc.close()
    return statistics.median(pre), statistics.median(post)


# Long enough that the reply is still thinking when Gradio draws its first frame (≈1 s at 200 tok/s):
# a finished reply collapses its thinking, so its first token would never be on screen.
TTFT_PROBE_TOKENS = 200


def ttft(args: argparse.Namespace, drv: BrowserDriver, engine_url: str, model: str) -> None:
    runs: dict[str, list[float]] = {"direct": [], "panel": [], "added": [], "floor": [], "over_floor": []}
    for i in range(args.ttft_runs + 1):
        prompt = f"ttft probe {i}"
        d, *_, first = direct(engine_url, model, prompt, TTFT_PROBE_TOKENS)
        drv.new_chat(TTFT_PROBE_TOKENS)
        panel = drv.send_timed(prompt, first.strip() or first) * 1000
        drv.wait_done()
        floor = drv.floor_timed(i) * 1000
        if i:  # the first run warms the page (fonts, first Markdown render)
            added = panel - d * 1000
            runs["direct"].append(d * 1000)
            runs["panel"].append(panel)
            runs["added"].append(added)
            runs["floor"].append(floor)
            runs["over_floor"].append(added - floor)
    med = {k: statistics.median(v) for k, v in runs.items()}
    added = runs["added"]
    print(f"\nTTFT, {args.ttft_runs} runs interleaved, timed in the page (click event → first token in the DOM, shown):")
    print(f"  engine direct p50 {med['direct']:.1f} ms; panel p50 {med['panel']:.1f} ms")
    print(f"  TTFT added by the panel (Gradio's streaming event): p50 {med['added']:.1f} ms "
          f"(min {min(added):.1f}, max {max(added):.1f})")
    print(f"  Gradio's own event floor (click → a one-yield Chatbot event on screen), same run: p50 {med['floor']:.1f} ms")
    print(f"  added TTFT over the floor: p50 {med['over_floor']:.1f} ms   [goal ≤ 10 ms]")
    print(f"  (not counted: the browser's input latency, click timeStamp → dispatch to the page, p50 "
          f"{statistics.median(drv.input_lag_ms):.1f} ms)")
    pre, post = server_side(engine_url, args.ttft_runs)
    print(f"  chat code itself (in process): request leaves {pre:.2f} ms after send(); first token → its frame "
          f"{post:.2f} ms (p50)")


def long_answer(args: argparse.Namespace, drv: BrowserDriver, engine_url: str, model: str, panel_proc,
                data_dir: str) -> None:
    prompt = "Write the full design document."
    result: dict[str, Any] = {}
    th = threading.Thread(target=lambda: result.update(zip(("ttft", "thinking", "answer", "tokens", "first"),
                                                           direct(engine_url, model, prompt, args.tokens), strict=True)))
    drv.new_chat(args.tokens)
    idle0, t_idle = cpu_s(panel_proc), time.perf_counter()
    time.sleep(5.0)  # measuring the idle page (its 1 s timer) as a baseline, not synchronisation
    idle = 100 * (cpu_s(panel_proc) - idle0) / (time.perf_counter() - t_idle)
    marks: list[tuple[int, float, float]] = []  # (tokens, panel cpu s, browser main-thread s)
    cpu0, task0, wall0 = cpu_s(panel_proc), drv.task_s(), time.perf_counter()
    marks.append((0, cpu0, task0))
    th.start()
    drv.page.fill("#chat-input textarea", prompt)
    drv.page.click("#chat-send")
    while True:
        n = drv.live_tokens()
        line = drv.page.evaluate(JS_LIVE_LINE)
        if re.search(r"profile \S+ · TTFT", line):
            break
        if n is not None and n // 1000 > marks[-1][0] // 1000:
            marks.append((n, cpu_s(panel_proc), drv.task_s()))
        time.sleep(0.05)  # sampling period of this meter, not synchronisation
    cpu1, task1, wall1 = cpu_s(panel_proc), drv.task_s(), time.perf_counter()
    th.join()
    wall = wall1 - wall0
    dom_words = len(drv.page.evaluate(JS_ANSWER_TEXT).split())
    direct_words = len(result["answer"].split())
    reasoning, content = stored_reply(data_dir)
    identical = (reasoning.strip(), content.strip()) == (result["thinking"].strip(), result["answer"].strip())
    print(f"\nlong answer: {args.tokens} tokens at {args.tok_s:g} tok/s, {wall:.1f} s wall, panel and direct side by side")
    print(f"  panel stats line: {line}")
    print(f"  tokens lost: {max(0, direct_words - dom_words)} (answer words on screen {dom_words}, direct {direct_words}; "
          f"stored reply identical to the direct stream: {identical})   [target 0]")
    print(f"  panel process CPU: {100 * (cpu1 - cpu0) / wall:.1f} % of one core   [target ≤ 25 %]  "
          f"(idle page baseline {idle:.1f} %; browser main thread {100 * (task1 - task0) / wall:.1f} %)")
    windows = [(b[0], b[1] - a[1], b[2] - a[2]) for a, b in pairwise(marks) if b[0] - a[0] <= 1200]
    if os.environ.get("BENCH_DEBUG"):
        print("marks", marks)
    if len(windows) >= 3:
        (_, p_first, b_first), (_, p_last, b_last) = windows[0], windows[-1]
        print(f"  cost of the last 1k tokens' updates vs the first 1k: panel CPU {p_last * 1000:.0f} / "
              f"{p_first * 1000:.0f} ms = {p_last / p_first:.2f}×; browser main thread {b_last * 1000:.0f} / "
              f"{b_first * 1000:.0f} ms = {b_last / b_first:.2f}×   [target ≤ 1.5×]")
        print("  panel CPU ms per 1k tokens: " + " ".join(f"{c * 1000:.0f}" for _, c, _ in windows))
        print("  browser ms per 1k tokens:   " + " ".join(f"{b * 1000:.0f}" for _, _, b in windows))


if __name__ == "__main__":
    sys.exit(main())
