"""Benchmark: the panel's chat end to end vs the engine directly, against the SIMULATED engine.

    .venv/bin/python bench/chat_stream.py [--tokens 20000] [--tok-s 200] [--ttft-runs 20]

Processes: the simulated engine, the panel (Chat tab only, Gradio), headless Chromium on the panel
page, and this driver, which also streams the same requests from the engine directly (openai SDK).
Prints:

* TTFT added by the panel, p50 (target ≤ 5 ms): click on Send → first thinking token on screen,
  minus first token direct, same prompt, runs interleaved.
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 60.0) -> None:
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
    from app.backend.chat.service import ChatService
    from app.backend.engine.types import EngineSnapshot, EngineState
    from app.backend.settings import resolve_settings
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
    blocks.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    print("PANEL READY", flush=True)
    threading.Event().wait()


# ---- driver ------------------------------------------------------------------------------------------


def direct(engine_url: str, model: str, prompt: str, max_tokens: int) -> tuple[float, str, str, int]:
    """Stream the same request from the engine: (TTFT s, thinking, answer, completion tokens)."""
    from app.backend.chat.client import ChatClient, ChatRequest, SamplingParams
    from app.backend.chat.events import ContentDelta, ReasoningDelta, UsageReport

    client = ChatClient(engine_url)
    req = ChatRequest(model, [{"role": "user", "content": prompt}], SamplingParams(1.0, 1.0, 0.05, max_tokens),
                      {"ignore_eos": True})
    t0 = time.perf_counter()
    first = None
    thinking: list[str] = []
    answer: list[str] = []
    tokens = 0
    for ev in client.stream(req):
        if isinstance(ev, (ReasoningDelta, ContentDelta)):
            if first is None:
                first = time.perf_counter() - t0
            (thinking if isinstance(ev, ReasoningDelta) else answer).append(ev.text)
        elif isinstance(ev, UsageReport):
            tokens = ev.completion_tokens
    client.close()
    return first or float("nan"), "".join(thinking), "".join(answer), tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=20000, help="length of the long answer")
    ap.add_argument("--tok-s", type=float, default=200.0, help="simulated decode rate")
    ap.add_argument("--ttft-runs", type=int, default=20)
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
            for p in procs:  # only the processes this bench started
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()


def cpu_s(proc) -> float:
    t = proc.cpu_times()
    return t.user + t.system


JS_SEND_AND_TIME_FIRST_TOKEN = """
async () => {
  const bot = document.querySelector('#chat-bot');
  const t0 = performance.now();
  return await new Promise(resolve => {
    const obs = new MutationObserver(() => {
      if (bot.querySelector('.thought-group')) { obs.disconnect(); resolve(performance.now() - t0); }
    });
    obs.observe(bot, {childList: true, subtree: true, characterData: true});
    document.querySelector('#chat-send').click();
  });
}
"""
JS_FLOOR = """
async (want) => {
  const bot = document.querySelector('#bench-floor-bot');
  const t0 = performance.now();
  return await new Promise(resolve => {
    const obs = new MutationObserver(() => {
      if (bot.innerText.includes(want)) { obs.disconnect(); resolve(performance.now() - t0); }
    });
    obs.observe(bot, {childList: true, subtree: true, characterData: true});
    document.querySelector('#bench-floor-go').click();
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

    def task_s(self) -> float:
        """Cumulative busy time of the page's main thread (script, style, layout, paint)."""
        metrics = self.cdp.send("Performance.getMetrics")["metrics"]
        return next(m["value"] for m in metrics if m["name"] == "TaskDuration")

    def new_chat(self, max_tokens: int) -> None:
        self.page.click("#chat-new")
        self.page.wait_for_function("() => !document.querySelector('#chat-bot [data-testid=bot]')")
        self.page.fill("#chat-max-tokens input", str(max_tokens))
        self.page.locator("#chat-max-tokens input").press("Tab")

    def send_timed(self, prompt: str) -> float:
        """Send; seconds from the click to the first thinking token on screen."""
        self.page.fill("#chat-input textarea", prompt)
        return self.page.evaluate(JS_SEND_AND_TIME_FIRST_TOKEN) / 1000

    def floor_timed(self, i: int) -> float:
        self.page.fill("#bench-floor-in textarea", f"f{i}")
        return self.page.evaluate(JS_FLOOR, f"tokf{i}") / 1000

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
            ttft(args, drv, engine_url, model)
            long_answer(args, drv, engine_url, model, panel_proc, data_dir)
        finally:
            drv.browser.close()
    return 0


def server_side(engine_url: str, runs: int) -> tuple[float, float]:
    """The chat code's own latency, in this process: send() until the request leaves, and first
    token arrival until its frame is rendered (p50 ms)."""
    from app.backend.chat.client import SamplingParams
    from app.backend.chat.service import ChatService
    from app.backend.engine.types import EngineSnapshot, EngineState
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


def ttft(args: argparse.Namespace, drv: BrowserDriver, engine_url: str, model: str) -> None:
    added, panel_ms, direct_ms, floor_ms = [], [], [], []
    drv.new_chat(8)
    for i in range(args.ttft_runs + 1):
        prompt = f"ttft probe {i}"
        d, *_ = direct(engine_url, model, prompt, 8)
        drv.new_chat(8) if i else None
        p = drv.send_timed(prompt)
        drv.wait_done()
        f = drv.floor_timed(i)
        if i:  # the first run warms the page (fonts, first Markdown render)
            added.append((p - d) * 1000)
            panel_ms.append(p * 1000)
            direct_ms.append(d * 1000)
            floor_ms.append(f * 1000)
    print(f"\nTTFT, {args.ttft_runs} runs interleaved: panel (click → first thinking token on screen) p50 "
          f"{statistics.median(panel_ms):.1f} ms; engine direct p50 {statistics.median(direct_ms):.1f} ms")
    print(f"  TTFT added by the panel: p50 {statistics.median(added):.1f} ms "
          f"(min {min(added):.1f}, max {max(added):.1f})   [target ≤ 5 ms p50]")
    pre, post = server_side(engine_url, args.ttft_runs)
    print(f"  chat code itself (in process): request leaves {pre:.2f} ms after send(); first token → its frame "
          f"{post:.2f} ms (p50)")
    floor = statistics.median(floor_ms)
    print(f"  of which Gradio's own floor (click → a one-yield Chatbot event on screen, same page): p50 {floor:.1f} ms;"
          f" the chat's own share ≈ {statistics.median(added) - floor:.1f} ms")


def long_answer(args: argparse.Namespace, drv: BrowserDriver, engine_url: str, model: str, panel_proc,
                data_dir: str) -> None:
    prompt = "Write the full design document."
    result: dict[str, Any] = {}
    th = threading.Thread(target=lambda: result.update(zip(("ttft", "thinking", "answer", "tokens"),
                                                           direct(engine_url, model, prompt, args.tokens))))
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
    windows = [(b[0], b[1] - a[1], b[2] - a[2]) for a, b in zip(marks, marks[1:]) if b[0] - a[0] <= 1200]
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
