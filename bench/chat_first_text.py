"""Benchmark: first text on screen after Enter vs the engine's first token (issue 29 item 11).

    .venv/bin/python bench/chat_first_text.py [--runs 8] [--tok-s 48.9] [--chat-only]

The whole panel (every tab, demo mode, as `moet-panel serve` builds it) with its chat pointed at an
in-process SIMULATED engine, and headless Chromium on the Chat tab. Each run opens a new
conversation, types a prompt and presses Enter; in the page, a `keydown` listener notes the time and
a requestAnimationFrame loop notes when the reply's first text (thinking or answer) is *visible*:
in the DOM, non-empty, with a box of non-zero height (Gradio's Chatbot used to slide a pending
thought in from a 0 px height for 400 ms, so its text was in the page but not on screen). The
panel side notes when the request left and the engine's TTFT (its first token of any kind). Runs
are repeated with the fix's CSS rule removed from the page (the behaviour before it), same run, same page.

Prints per run and p50/max: Enter → first text on screen, the engine's TTFT, and first text on screen −
the engine's first token (goal ≤ 100 ms). Wall clocks of the browser and the panel are the same
machine's. Noisy on a shared 2-core box: read the medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

JS_ARM = """(withoutFix) => {
  if (withoutFix) {  // the behaviour before the fix: drop the rule that outranks the slide-in
    for (const sheet of [...document.styleSheets, ...(document.adoptedStyleSheets || [])]) {
      let rules; try { rules = sheet.cssRules; } catch (e) { continue; }
      for (let i = rules.length - 1; i >= 0; i--) {
        if ((rules[i].selectorText || '').includes('.thought-group .content')) sheet.deleteRule(i);
      }
    }
  }
  window.__m = {};
  window.__removed = withoutFix ? [...document.styleSheets, ...(document.adoptedStyleSheets || [])].length : -1;
  const bot = document.querySelector('#chat-bot');
  document.querySelector('#chat-input textarea').addEventListener('keydown',
      () => { window.__m.key = Date.now(); }, {once: true, capture: true});
  // the thought's own content box, or an answer bubble (one holding no thought)
  const shown = () => [...bot.querySelectorAll('.thought-group .content, .message.bot .message-content')]
      // (a box's rect ignores its clipping parents: text inside a thought counts through the thought's box)
      .filter(e => !e.querySelector('.thought-group') && !(e.closest('.thought-group') && !e.matches('.content')))
      .some(e => e.textContent.trim()
                 && !/waiting for the first token|thinking ·|answering ·/.test(e.textContent)
                 && e.getBoundingClientRect().height > 0);
  const tick = () => {
    if (window.__m.key && !window.__m.dom && /(thinking|answering) · \\d+ tokens/.test(bot.innerText)) window.__m.dom = Date.now();
    if (window.__m.key && shown()) { window.__m.vis = Date.now(); return; }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
}"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=8, help="runs per variant (with the fix, without it)")
    ap.add_argument("--tok-s", type=float, default=48.9, help="simulated decode rate (the card's profile 1)")
    ap.add_argument("--chat-only", action="store_true", help="only the Chat tab (no other tab's timers)")
    args = ap.parse_args()

    from playwright.sync_api import sync_playwright

    import app.ui.app as ui_app
    import app.backend.chat.conversations as chat_service
    from app.backend.chat.conversations import ChatService
    from app.backend.config.settings import resolve_settings
    from app.backend.state import AppState, build_app_state
    from tests.chat.chat_helpers import FakeEngine, start_sim
    from tests.conftest import free_port

    sent: list[float] = []
    original = chat_service.ChatStream

    def stream(client: Any, request: Any) -> Any:  # when the chat sends its request
        sent.append(time.time())
        return original(client, request)

    chat_service.ChatStream = stream  # type: ignore[misc, assignment]
    home = Path.home() / ".cache" / "moet-panel-bench"
    home.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=home) as tmp:
        sim = start_sim(decode_tok_s=args.tok_s)
        settings = resolve_settings(demo=True, data_dir=Path(tmp) / "data")
        settings.ensure_state_dir()
        if args.chat_only:
            state = AppState(settings=settings)
            ui_app.TABS[:] = ["app.ui.chat"]
        else:
            state = build_app_state(settings)
            state.chat.close()  # the panel's own: re-pointed at the in-process engine below
        engine = FakeEngine(sim, profile_id="quality")
        chat = state.chat = ChatService(settings.recipe, settings.state_dir, snapshot_fn=engine.snapshot)
        blocks = ui_app.build_ui(state)
        url = ui_app.launch(blocks, "127.0.0.1", free_port())
        rows: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=["--no-sandbox"])
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(url)
                if not args.chat_only:
                    page.get_by_role("tab", name="Chat").click()
                page.wait_for_function("() => document.querySelector('#chat-banner')?.innerText.includes('Engine ready')")
                for i in range(2 * args.runs):
                    without = i >= args.runs  # the rule, once removed, stays removed: those runs last
                    page.click("#chat-new")
                    page.wait_for_function("() => !document.querySelector('#chat-bot .message')")
                    page.fill("#chat-input textarea", f"Explain the FP4 delta tier, take {i}.")
                    page.evaluate(JS_ARM, without)
                    sent.clear()
                    page.keyboard.press("Enter")
                    page.wait_for_function("() => window.__m.vis", timeout=60_000)
                    m = page.evaluate("() => window.__m")
                    cid = chat.list_conversations()[0].id
                    turn = chat.active_turn(cid)
                    if turn is not None:
                        turn.done.wait(60)
                    stats = chat.get(cid).messages[-1].stats
                    ttft = stats.ttft_s if stats and stats.ttft_s is not None else float("nan")
                    first_token = sent[0] + ttft
                    row = ((m["vis"] / 1000 - m["key"] / 1000) * 1000, ttft * 1000, (m["vis"] / 1000 - first_token) * 1000)
                    rows[without].append(row)
                    print(f"run {i:2d} {'before fix' if without else 'with fix  '}: Enter → first text on screen "
                          f"{row[0]:6.0f} ms · engine TTFT {row[1]:5.0f} ms · on screen after the engine's first "
                          f"token {row[2]:6.0f} ms · (live line in the DOM {m.get('dom', 0) / 1000 - m['key'] / 1000:.3f} s)", flush=True)
                browser.close()
        finally:
            blocks.close()
            state.close()
            chat.close()
            sim.stop()
    print(f"\n{'all tabs' if not args.chat_only else 'Chat tab only'}, {args.runs} runs each, decode {args.tok_s} tok/s, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'':28s} {'Enter→on screen':>16s} {'engine TTFT':>12s} {'after 1st token':>16s}  (p50 / max, ms)")
    for without in (False, True):
        r = rows[without]
        cols = [f"{statistics.median(c):6.0f} / {max(c):5.0f}" for c in zip(*r, strict=True)]
        print(f"{'before the fix (no CSS rule)' if without else 'with the fix':28s} {cols[0]:>16s} {cols[1]:>12s} {cols[2]:>16s}")
    print("goal: first text on screen within 100 ms of the engine's first token (p50)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
