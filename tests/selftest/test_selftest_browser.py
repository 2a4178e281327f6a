"""The Self-test tab end to end in headless Chromium on the SIMULATED engine (real Docker), and this box's
result on the Profiles cards: shown beside the card's figure, stale after the image changes, run again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.backend.state import AppState
from tests.conftest import serving

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.docker, pytest.mark.timeout(900)]


def test_selftest_tab_runs_cancels_shows_card_beside_box(demo_state: AppState, browser: Any) -> None:
    state = demo_state
    engine, selftest = state.engine, state.selftest
    assert engine is not None and selftest is not None
    with serving(state) as panel:
        page = browser.new_page(1280, 1000)
        page.set_default_timeout(90_000)  # the test box is shared by several engineers' suites
        page.goto(panel.url)
        card = page.locator('.moet-card[data-profile="quality"] .moet-selftest')
        assert card.inner_text() == "this box: not self-tested yet"
        page.get_by_role("tab", name="Self-test").click()
        page.wait_for_function("() => document.querySelector('#st-status')?.innerText.includes('start profile quality first')")
        # Run is disabled while the line says it cannot run, and follows the engine becoming ready
        page.wait_for_function("() => document.querySelector('#st-run')?.disabled === true")
        assert engine.start("quality").accepted
        assert engine.wait_for(lambda s: s.is_ready, 90).is_ready
        page.wait_for_function("() => document.querySelector('#st-status')?.innerText.includes('ready to run')")
        page.wait_for_function("() => document.querySelector('#st-run')?.disabled === false")
        # cancel: a long run, cancelled from the page, saves nothing and leaves the engine up
        page.fill("#st-needles textarea, #st-needles input", "")
        page.fill("#st-tokens input", "4000")
        page.click("#st-run")
        page.wait_for_selector("#st-progress[data-state=running] progress")
        page.wait_for_function("() => document.querySelector('#st-run')?.disabled === true")  # one run at a time
        page.click("#st-cancel")
        page.wait_for_function("() => document.querySelector('#st-status')?.innerText.includes('cancelled')")
        assert selftest.store.latest("quality") is None and engine.snapshot().is_ready
        # a real (short) run with needles: progress, then the result beside the card's figure
        page.fill("#st-tokens input", "100")
        page.fill("#st-runs input", "2")
        page.fill("#st-needles textarea, #st-needles input", "64k,256k")
        page.click("#st-run")
        page.wait_for_selector("#st-progress[data-state=running]")
        page.wait_for_function("() => document.querySelector('#st-figures tr[data-profile=quality]')"
                               "?.innerText.includes('SIMULATED box')", timeout=120_000)
        row = page.inner_text("#st-figures tr[data-profile=quality]")
        assert "48.9 tok/s" in row and "card 48.9 · SIMULATED box" in row and "2 runs" in row, row
        assert "as the card" in row
        page.wait_for_function("() => document.querySelector('#st-result')?.innerText.includes('256K: 3/3 depths')")
        with page.expect_download() as dl:
            page.click("#st-export-md")
        md = Path(dl.value.path()).read_text()
        assert md.startswith("# Self-test: profile quality (SIMULATED engine)") and "64K: 3/3 depths" in md
        browser.snap(page, "selftest-result", docs="selftest-result")

        # the Profiles card shows the same line beside the card's own figure
        first = selftest.store.latest("quality")
        assert first is not None
        page.get_by_role("tab", name="Profiles").click()  # opening the tab redraws the cards
        page.wait_for_function("() => document.querySelector('.moet-card[data-profile=quality] .moet-selftest')"
                               "?.dataset.state === 'current'")
        line = card.inner_text()
        assert line.startswith("card 48.9 · SIMULATED box") and "2 runs" in line and first.date[:10] in line, line
        assert "as the card" in line and "run it again" not in line
        assert page.locator('.moet-card[data-profile="quality"] [data-fig="decode"]').inner_text() == "48.9 tok/s"
        assert page.locator('.moet-card[data-profile="balanced"] .moet-selftest').inner_text() == "this box: not self-tested yet"
        assert "again" in page.inner_text("#profile-selftest-run")

        # the engine image is rebuilt (a new content id under the same tag): the card says so and offers a re-run
        path = next(selftest.store.root.glob("quality--*.json"))
        data = json.loads(path.read_text())
        data["image_id"] = "sha256:" + "0" * 64
        path.write_text(json.dumps(data))
        page.get_by_role("tab", name="Self-test").click()  # opening a tab redraws what it shows of the result
        page.wait_for_function("() => document.querySelector('#st-figures tr[data-profile=quality]')"
                               "?.innerText.includes('image changed')")
        page.get_by_role("tab", name="Profiles").click()
        page.wait_for_function("() => document.querySelector('.moet-card[data-profile=quality] .moet-selftest')"
                               "?.dataset.state === 'stale'")
        assert "the engine image changed (sha256:000000000000 →" in card.inner_text() and "run it again" in card.inner_text()
        button = page.locator("#profile-selftest-run")
        assert "again: its setup changed" in button.inner_text()
        browser.snap(page, "profiles-selftest", docs="profiles-selftest", clip_to="#profile-cards")
        button.click()  # runs the same plan again on the engine as it is, on the Self-test tab
        page.wait_for_function("() => document.querySelector('#tab-selftest')?.offsetParent !== null")
        page.wait_for_selector("#st-progress[data-state=running]")
        page.wait_for_function("() => document.querySelector('#st-figures tr[data-profile=quality]')"
                               "?.innerText.includes('as the card') && !document.querySelector("
                               "'#st-figures tr[data-profile=quality]').innerText.includes('run it again')",
                               timeout=120_000)
        again = selftest.store.latest("quality")
        assert again is not None and again.date > first.date and len(again.decode) == 2
        assert again.plan == first.plan and again.image_id == first.image_id
        assert engine.snapshot().is_ready and engine.snapshot().profile_id == "quality"  # left alone
        page.get_by_role("tab", name="Profiles").click()
        page.wait_for_function("() => document.querySelector('.moet-card[data-profile=quality] .moet-selftest')"
                               "?.dataset.state === 'current'")
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors


def test_run_again_refuses_while_the_engine_serves_another_profile(demo_state: AppState, browser: Any) -> None:
    state = demo_state
    engine, selftest = state.engine, state.selftest
    assert engine is not None and selftest is not None
    with serving(state) as panel:
        assert engine.start("balanced").accepted
        assert engine.wait_for(lambda s: s.is_ready, 90).is_ready
        page = browser.new_page(1280, 800)
        page.set_default_timeout(90_000)
        page.goto(panel.url)
        assert "Self-test max quality on this box" in page.inner_text("#profile-selftest-run")
        page.click("#profile-selftest-run")
        page.wait_for_function("() => document.querySelector('#profile-selftest-msg')?.innerText.includes('switch to quality first')")
        assert "never switches or restarts the engine" in page.inner_text("#profile-selftest-msg")
        assert engine.snapshot().profile_id == "balanced" and selftest.store.latest("quality") is None
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors


def test_the_tab_opens_on_the_profile_that_serves(demo_state: AppState, browser: Any) -> None:
    """Issue 42: a page loaded before the engine started opened Self-test on the profile picked at load
    ("#1 max quality — cannot run now: the engine serves balanced"); it opens on the serving profile."""
    state = demo_state
    engine = state.engine
    assert engine is not None
    with serving(state) as panel:
        page = browser.new_page(1280, 900)
        page.set_default_timeout(90_000)
        page.goto(panel.url)
        page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached")
        page.get_by_role("tab", name="Self-test").click()  # seen once while nothing serves: quality picked
        page.wait_for_function("() => document.querySelector('#st-status')?.innerText.includes('start profile quality first')")
        page.get_by_role("tab", name="Profiles").click()
        assert engine.start("balanced").accepted
        assert engine.wait_for(lambda s: s.is_ready, 90).is_ready
        page.get_by_role("tab", name="Self-test").click()
        page.wait_for_function("() => document.querySelector('#st-status')?.innerText.includes('ready to run')")
        assert "balanced" in page.input_value("#st-profile input").lower() or \
            "balanced" in page.inner_text("#st-profile").lower()
        assert "cannot run now" not in page.inner_text("#st-status")
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors
