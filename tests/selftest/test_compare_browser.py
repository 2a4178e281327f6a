"""The Compare tab: a small blind A/B (2 prompts × 2 seeds, one of them picked from the chat history)
graded by picks and by scores beside a rubric, in headless Chromium on the SIMULATED engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.backend.chat.models import Conversation, Message
from app.backend.chat.conversations import DB_NAME
from app.backend.chat.store import ChatStore
from app.backend.state import AppState
from tests.conftest import serving
from tests.journey.conftest import open_panel

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.docker, pytest.mark.timeout(900)]

RUBRIC = "10 = correct and complete; 5 = right idea with gaps; 0 = wrong or cut off"


def _set_slider(page: Any, elem: str, value: float) -> None:
    box = page.locator(f"#{elem} input[type=number]")
    box.fill(str(value))
    box.press("Enter")
    page.wait_for_function("([e, v]) => document.querySelector(`#${e} input[type=range]`)?.value == v", arg=[elem, str(value)])


def test_blind_ab_from_chat_history_graded_by_pick_and_score(demo_state: AppState, browser: Any) -> None:
    state = demo_state
    engine, abtest = state.engine, state.abtest
    assert engine is not None and abtest is not None
    # both sides decode at 400 tok/s instead of the card's 48.9 / 83.2: the eight whole answers (up to 420 tokens
    # each) took ~30 s; this test is the Compare tab's workflow, the speeds per side are test_abtest.py's and test_cli.py's
    engine.options.extra_env = {**engine.options.extra_env, "MOET_SIM_DECODE_TOK_S": "400"}
    store = ChatStore(state.settings.state_dir / DB_NAME)  # a conversation the user had before
    conv = Conversation(title="raft review", system_prompt="You review distributed-systems designs.",
                        messages=[Message("user", "Explain Raft joint consensus."), Message("assistant", "Joint consensus is...")])
    store.create(conv)
    store.close()
    with serving(state) as panel:
        assert engine.start("quality").accepted
        assert engine.wait_for(lambda s: s.is_ready, 90).is_ready
        page = browser.new_page(1280, 1100)
        page.set_default_timeout(90_000)  # the test box is shared by several engineers' suites
        open_panel(page, panel.url)  # the page's load event has drawn it: a click now is not redrawn over
        page.get_by_role("tab", name="Compare").click()
        page.dispatch_event("#ab-start", "click")  # no prompts yet: a clear error, nothing started
        page.wait_for_function("() => document.querySelector('#ab-status')?.innerText.includes('no prompts')")
        page.locator("#ab-b input").click()  # pick B from the list: a typed value raced the Start click
        page.get_by_role("option", name="speed", exact=True).click()
        page.wait_for_function("() => document.querySelector('#ab-b input')?.value === 'speed'")
        page.fill("#ab-prompts textarea", "Implement a lock-free MPMC queue.")
        # the second prompt: the user turn of a stored conversation, sent after its system prompt
        page.locator("#ab-chat-box").get_by_text("Prompts from chat history").click()
        page.locator("#ab-chat-convs input").click()
        page.get_by_role("option", name="raft review · 2 messages").click()
        page.keyboard.press("Escape")
        turn = page.get_by_label("raft review · turn 1 (+1 earlier): Explain Raft joint consensus.")
        turn.check()
        assert page.locator("#ab-chat-context input").is_checked()
        page.fill("#ab-seeds textarea, #ab-seeds input", "1,2")
        page.fill("#ab-max input", "800")
        page.dispatch_event("#ab-start", "click")
        page.wait_for_selector("#ab-progress[data-state=running]")
        # Start and Resume answer "already running" meanwhile: disabled while the run goes, enabled after it
        page.wait_for_function("() => document.querySelector('#ab-start')?.disabled === true"
                               " && document.querySelector('#ab-resume')?.disabled === true")
        page.wait_for_selector("#ab-pair-head[data-left='4']", timeout=120_000)
        page.wait_for_function("() => document.querySelector('#ab-start')?.disabled === false")
        # switched for B through the controller (B's answers are in the journal), then back to what it served
        # before the run (issue 49)
        assert engine.snapshot().profile_id == "quality" and engine.snapshot().is_ready
        rid = abtest.journal.runs()[0]
        spec = abtest.journal.load(rid).spec
        assert [p.text for p in spec.prompts] == ["Implement a lock-free MPMC queue.", "Explain Raft joint consensus."]
        assert spec.prompts[1].source == f"chat {conv.id} turn 1"
        assert spec.prompts[1].context == (("system", "You review distributed-systems designs."),)
        body = page.inner_text("#ab-left") + page.inner_text("#ab-right")
        assert "speed" not in body and "quality" not in body  # names hidden
        page.fill("#ab-rubric textarea", RUBRIC)
        page.dispatch_event("#ab-rubric-save", "click")
        # pairs run prompt-within-seed: (p1, 1), (p2, 1), (p1, 2), (p2, 2); p1 by pick, the chat turn p2 by score
        for n, left in enumerate(("3", "2", "1", "0")):
            if n % 2 == 0:
                page.get_by_label("Pick: left / right / tie").check()
                page.wait_for_selector("#ab-pick-left", state="visible")
                page.dispatch_event("#ab-pick-left" if n == 0 else "#ab-pick-tie", "click")
            else:
                page.get_by_label("Score each side 0–10").check()
                page.wait_for_selector("#ab-score-save", state="visible")
                assert not page.locator("#ab-pick-left").is_visible()
                assert page.locator("#ab-rubric textarea").input_value() == RUBRIC  # beside the pair
                assert f"seed {n // 2 + 1} · sent after 1 earlier message of its chat" in page.inner_text("#ab-head")
                assert page.input_value("#ab-prompt textarea") == "Explain Raft joint consensus."
                lv, rv = ((8, 3), (6.5, 7))[n // 2]
                _set_slider(page, "ab-score-left", lv)
                _set_slider(page, "ab-score-right", rv)
                if n == 3:
                    page.fill("#ab-note textarea, #ab-note input", "both fine")
                page.dispatch_event("#ab-score-save", "click")
            page.wait_for_selector(f"#ab-pair-head[data-left='{left}']", timeout=60_000)
            if n == 0:
                assert abtest.journal.load(rid).rubric == RUBRIC
        st = abtest.journal.load(rid)
        scored = [g for g in st.grades.values() if g.left is not None]
        assert len(st.grades) == 4 and sorted((g.left, g.right) for g in scored) == [(6.5, 7.0), (8.0, 3.0)]
        assert any(g.note == "both fine" for g in scored)
        page.dispatch_event("#ab-reveal-btn", "click")
        page.wait_for_function("() => document.querySelector('#ab-reveal')?.innerText.includes('Scores (0–10)')")
        text = page.inner_text("#ab-reveal")
        assert "B (speed) − A (quality)" in text and "win/tie/loss for B" in text and "graded 4 of 4" in text
        assert "Scores (0–10), 2 scored pairs" in text and "rubric: 10 = correct and complete" in text
        assert "only extra seeds add real information" in text
        with page.expect_download() as dl:
            page.click("#ab-export-json")
        data = json.loads(Path(dl.value.path()).read_text())
        assert data["scores"]["pairs"] == 2 and data["graded"] == 4 and data["rubric"] == RUBRIC
        assert data["scores"]["points"]["seed_blocked"]["n"] == 2 and "B − A in points, seed-blocked" in text
        page.locator("#ab-reveal").scroll_into_view_if_needed()
        browser.snap(page, "abtest-reveal", docs="abtest-reveal")
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors
