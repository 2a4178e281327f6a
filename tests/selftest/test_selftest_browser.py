"""The Self-test tab end to end in headless Chromium on the SIMULATED engine (real Docker)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from app.backend.settings import resolve_settings
from app.backend.state import AppState, build_app_state
from tests.conftest import ROOT, serving
from tests.engine.conftest import TEST_LABEL
from tests.selftest.conftest import FAST_ENV, recipe_file

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.docker]


@pytest.fixture
def demo_state(docker_client, sim_settings, tmp_path: Path) -> Iterator[AppState]:
    settings = resolve_settings(recipe_file(tmp_path, sim_settings), tmp_path / "data", demo=True)
    settings.ensure_state_dir()
    state = build_app_state(settings)
    state.engine.options.extra_labels = dict(TEST_LABEL)
    state.engine.options.extra_env = dict(FAST_ENV)
    try:
        yield state
    finally:
        state.close()
        for c in docker_client.containers.list(all=True, filters={"label": "moet-panel.test=1"}):
            if c.labels.get("moet-panel.recipe") == settings.recipe.id:
                c.remove(force=True)


def test_selftest_tab_runs_cancels_shows_card_beside_box(demo_state: AppState, browser: Any) -> None:
    state = demo_state
    with serving(state) as panel:
        page = browser.new_page(1280, 1000)
        page.goto(panel.url)
        page.get_by_role("tab", name="Self-test").click()
        page.wait_for_function("() => document.querySelector('#st-status')?.innerText.includes('start profile quality first')")
        assert state.engine.start("quality").accepted
        assert state.engine.wait_for(lambda s: s.is_ready, 90).is_ready
        page.wait_for_function("() => document.querySelector('#st-status')?.innerText.includes('ready to run')")
        # cancel: a long run, cancelled from the page, saves nothing and leaves the engine up
        page.fill("#st-needles textarea, #st-needles input", "")
        page.fill("#st-tokens input", "4000")
        page.click("#st-run")
        page.wait_for_selector("#st-progress[data-state=running] progress")
        page.click("#st-cancel")
        page.wait_for_function("() => document.querySelector('#st-status')?.innerText.includes('cancelled')")
        assert state.selftest.store.latest("quality") is None and state.engine.snapshot().is_ready
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
        shot = browser.snap(page, "selftest-result")
        shutil.copy(shot, ROOT / "docs" / "selftest-result.png")
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors
