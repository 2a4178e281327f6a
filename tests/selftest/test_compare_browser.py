"""The Compare tab: a small blind A/B (2 prompts × 2 seeds) in headless Chromium on the SIMULATED engine."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from app.backend.state import AppState
from tests.conftest import ROOT, serving
from tests.selftest.test_selftest_browser import demo_state  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.docker, pytest.mark.timeout(900)]


def test_blind_ab_grade_and_reveal(demo_state: AppState, browser: Any) -> None:  # noqa: F811
    state = demo_state
    with serving(state) as panel:
        assert state.engine.start("quality").accepted
        assert state.engine.wait_for(lambda s: s.is_ready, 90).is_ready
        page = browser.new_page(1280, 1100)
        page.set_default_timeout(90_000)  # the test box is shared by several engineers' suites
        page.goto(panel.url)
        page.get_by_role("tab", name="Compare").click()
        page.dispatch_event("#ab-start", "click")  # no prompts yet: a clear error, nothing started
        page.wait_for_function("() => document.querySelector('#ab-status')?.innerText.includes('no prompts')")
        page.locator("#ab-b input").click()  # pick B from the list: a typed value raced the Start click
        page.get_by_role("option", name="speed", exact=True).click()
        page.wait_for_function("() => document.querySelector('#ab-b input')?.value === 'speed'")
        page.fill("#ab-prompts textarea", "Implement a lock-free MPMC queue.\n---\nExplain Raft joint consensus.")
        page.fill("#ab-seeds textarea, #ab-seeds input", "1,2")
        page.fill("#ab-max input", "800")
        page.dispatch_event("#ab-start", "click")
        page.wait_for_selector("#ab-progress[data-state=running]")
        page.wait_for_selector("#ab-pair-head[data-left='4']", timeout=120_000)
        assert state.engine.snapshot().profile_id == "speed"  # switched for B through the controller
        body = page.inner_text("#ab-left") + page.inner_text("#ab-right")
        assert "speed" not in body and "quality" not in body  # names hidden
        for pick, left in (("left", "3"), ("right", "2"), ("tie", "1")):
            page.dispatch_event(f"#ab-pick-{pick}", "click")  # no navigation wait: the box is shared and slow
            page.wait_for_selector(f"#ab-pair-head[data-left='{left}']", timeout=60_000)
        page.fill("#ab-note textarea, #ab-note input", "right side stops mid-answer")
        page.dispatch_event("#ab-pick-left", "click")
        page.wait_for_selector("#ab-pair-head[data-left='0']", timeout=60_000)
        page.dispatch_event("#ab-reveal-btn", "click")
        page.wait_for_function("() => document.querySelector('#ab-reveal')?.innerText.includes('seed-blocked')")
        text = page.inner_text("#ab-reveal")
        assert "B (speed) − A (quality)" in text and "win/tie/loss for B" in text and "graded 4 of 4" in text
        assert "only extra seeds add real information" in text
        rid = state.abtest.journal.runs()[0]
        st = state.abtest.journal.load(rid)
        assert len(st.grades) == 4 and any(g.note == "right side stops mid-answer" for g in st.grades.values())
        page.locator("#ab-reveal").scroll_into_view_if_needed()
        shot = browser.snap(page, "abtest-reveal")
        shutil.copy(shot, ROOT / "docs" / "abtest-reveal.png")
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors
