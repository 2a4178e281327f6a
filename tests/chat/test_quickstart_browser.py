"""Headless Chromium: the Chat tab's quick start (assets/js/chat_quickstart.js + the panel's route).

The page script posts Send to the panel's own route and draws the first tokens in a preview; the
Gradio event takes the same reply over (one engine request) and its rendering replaces the preview.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.backend.auth import add_user, load_users, make_checker
from app.backend.chat.fastroute import SEND_PATH
from tests.chat.chat_helpers import chat_panel, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BOT = "#chat-bot"
STATS = re.compile(r"^profile quality · TTFT")
# Keeps every preview node the script adds (it removes them at takeover; the node keeps its text).
WATCH_PREVIEWS = """() => {
  window.__previews = [];
  new MutationObserver((rs) => { for (const r of rs) for (const n of r.addedNodes)
    if (n.classList && n.classList.contains('moet-preview')) window.__previews.push(n); })
    .observe(document.querySelector('#chat-bot'), {childList: true, subtree: true});
}"""
PREVIEWS = """() => window.__previews.map((n) => ({connected: n.isConnected,
  thinking: n.querySelector('.moet-preview-r').textContent, answer: n.querySelector('.moet-preview-answer').textContent,
  user: n.querySelector('.moet-preview-user').textContent}))"""


@pytest.fixture
def panel(tmp_path: Path) -> Iterator[tuple[str, object, object]]:
    with chat_panel(tmp_path / "data", decode_tok_s=100.0) as p:
        yield p


def open_chat(browser, url: str):
    page = browser.new_page(1280, 900)
    page.goto(url)
    page.wait_for_function("() => document.querySelector('#chat-banner')?.innerText.includes('Engine ready')")
    page.wait_for_function("() => !!window.moetChat")
    # Gradio's handling of Send waits for the first token to be drawn (normally at most 50 ms: on a
    # loaded test machine the first token can take longer, and Gradio then draws it itself).
    page.evaluate("() => { window.moetChat.deferMs = 10000; }")
    page.evaluate(WATCH_PREVIEWS)
    routed: list[int] = []
    page.on("response", lambda r: routed.append(r.status) if r.url.endswith(SEND_PATH) else None)
    return page, routed


def set_max_tokens(page, n: int) -> None:
    page.get_by_text("Sampling and system prompt").click()
    page.fill("#chat-max-tokens input", str(n))
    page.locator("#chat-max-tokens input").press("Tab")


def finished(page) -> str:
    stats = page.locator(f"{BOT} sub", has_text=STATS)
    stats.wait_for()
    page.wait_for_function("() => !document.querySelector('#chat-bot .moet-preview')")
    return stats.inner_text()


def test_first_tokens_are_drawn_early_and_gradio_takes_the_same_reply_over(panel, browser) -> None:
    url, engine, p = panel
    page, routed = open_chat(browser, url)
    set_max_tokens(page, 120)
    page.fill("#chat-input textarea", "Explain the FP4 delta tier.")
    page.click("#chat-send")
    finished(page)
    msg = p.state.chat.get(p.state.chat.list_conversations()[0].id).messages[-1]
    previews = page.evaluate(PREVIEWS)
    assert routed == [200] and len(previews) == 1, (routed, previews)
    pv = previews[0]
    assert not pv["connected"]  # replaced by Gradio's own rendering
    assert pv["user"] == "Explain the FP4 delta tier."
    assert pv["thinking"] and msg.reasoning.startswith(pv["thinking"])  # the first tokens, drawn in order
    # Gradio's rendering shows the same, whole reply; the engine saw one request.
    assert page.locator(f"{BOT} .thought-group").count() == 1
    shown = page.locator(f"{BOT} [data-testid=bot]").all_inner_texts()
    assert any(msg.content.split()[0] in t for t in shown if msg.content)
    assert engine.sim.stats.requests == 1 and msg.status == "complete"
    assert page.locator("#chat-input textarea").input_value() == ""
    assert not browser.console_errors, browser.console_errors


def test_enter_edit_and_system_prompt_go_through_the_quick_start(panel, browser) -> None:
    """The Send's other inputs come from the script's mirror of Gradio's store: a wrong one would
    make the Gradio event refuse the reply (fastpath.TicketBook.claim)."""
    url, engine, p = panel
    page, routed = open_chat(browser, url)
    set_max_tokens(page, 20)
    page.fill("#chat-system textarea", "Answer in one line.")
    page.locator("#chat-system textarea").press("Tab")
    page.fill("#chat-input textarea", "first question")
    page.locator("#chat-input textarea").press("Enter")
    finished(page)
    page.click("#chat-edit")
    page.wait_for_function("() => document.querySelector('#chat-input textarea').value === 'first question'")
    page.fill("#chat-input textarea", "edited question")
    page.locator("#chat-input textarea").press("Enter")
    page.locator(f"{BOT} [data-testid=user]", has_text="edited question").wait_for()
    finished(page)
    conv = p.state.chat.get(p.state.chat.list_conversations()[0].id)
    assert [m.content for m in conv.messages if m.role == "user"] == ["edited question"]
    assert conv.system_prompt == "Answer in one line."
    assert engine.sim.stats.last_params["max_tokens"] == 20
    assert routed == [200, 200] and engine.sim.stats.requests == 2
    assert page.locator(f"{BOT} [data-testid=user]").count() == 1
    assert not browser.console_errors, browser.console_errors


def test_stop_right_after_send_aborts_the_reply_on_the_engine(panel, browser) -> None:
    url, engine, p = panel
    page, routed = open_chat(browser, url)
    page.fill("#chat-input textarea", "Write the full design document.")
    page.click("#chat-send")
    page.click("#chat-stop")  # before Gradio's event has taken the reply over
    page.locator(f"{BOT} sub", has_text="Stopped — partial answer kept").wait_for()
    wait_for(lambda: engine.sim.stats.aborted == 1, what="the engine to see the disconnect")
    assert engine.sim.stats.requests == 1 and engine.sim.stats.completed == 0
    page.wait_for_function("() => !document.querySelector('#chat-bot .moet-preview')")
    msg = p.state.chat.get(p.state.chat.list_conversations()[0].id).messages[-1]
    assert msg.status == "stopped"
    assert not browser.console_errors, browser.console_errors


def test_a_refused_quick_start_leaves_send_to_gradio(panel, browser) -> None:
    url, engine, p = panel
    page, routed = open_chat(browser, url)
    p.state.chat.delete(p.state.chat.list_conversations()[0].id)  # deleted in another tab
    page.fill("#chat-input textarea", "hello?")
    page.click("#chat-send")
    page.get_by_text("does not exist").first.wait_for()  # Gradio's error toast for its own send
    assert routed == [409] and engine.sim.stats.requests == 0
    page.wait_for_function("() => !document.querySelector('#chat-bot .moet-preview')")  # the message preview goes
    assert all(not pv["thinking"] for pv in page.evaluate(PREVIEWS))
    browser.console_errors.clear()  # the refused fetch is logged by the browser as a failed request


def test_quick_start_behind_the_login(tmp_path: Path, browser) -> None:
    auth = tmp_path / "auth"
    add_user(auth, "alice", "correct horse battery")
    with chat_panel(tmp_path / "data", auth=make_checker(load_users(auth)), decode_tok_s=200.0) as (url, engine, p):
        page = browser.new_page(1280, 900)
        page.goto(url)
        page.get_by_label("username", exact=False).fill("alice")
        page.get_by_label("password", exact=False).fill("correct horse battery")
        page.get_by_role("button", name="Login").click()
        page.wait_for_function("() => document.querySelector('#chat-banner')?.innerText.includes('Engine ready')")
        page.wait_for_function("() => !!window.moetChat")
        routed: list[int] = []
        page.on("response", lambda r: routed.append(r.status) if r.url.endswith(SEND_PATH) else None)
        set_max_tokens(page, 10)
        page.fill("#chat-input textarea", "hello")
        page.click("#chat-send")
        finished(page)
        assert routed == [200] and engine.sim.stats.requests == 1
        assert not browser.console_errors, browser.console_errors
