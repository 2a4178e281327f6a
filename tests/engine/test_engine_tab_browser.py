"""Headless Chromium clicks Start, then Switch, in the Engine tab and sees the state badge reach ready."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.backend.settings import Settings
from tests.conftest import ARTIFACTS, free_port, serving

from .conftest import TEST_LABEL, sim_recipe

pytestmark = [pytest.mark.browser, pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def engine_panel(docker_client, tmp_path: Path):
    from app.backend.recipe import SIMULATED_RECIPE
    from app.backend.state import build_app_state

    recipe = sim_recipe(free_port())
    settings = Settings(SIMULATED_RECIPE, recipe, tmp_path / "data", True)
    settings.ensure_state_dir()
    state = build_app_state(settings)
    state.engine.options.extra_env = {"MOET_SIM_BOOT_S": "1"}
    state.engine.options.extra_labels = dict(TEST_LABEL)
    try:
        with serving(state) as panel:
            yield panel.url, state
    finally:
        for c in docker_client.containers.list(all=True, filters={"label": f"moet-panel.recipe={recipe.id}"}):
            c.remove(force=True)


def test_start_then_switch_in_engine_tab(engine_panel, browser) -> None:
    url, state = engine_panel
    page = browser.new_page(1280, 1000)
    page.goto(url)
    page.get_by_role("tab", name="Engine").click()
    page.wait_for_selector('[data-testid="engine-state"][data-state="stopped"]')
    page.click("#engine-start")
    page.wait_for_selector('[data-testid="engine-state"][data-state="ready"]', timeout=40_000)
    assert "quality" in page.inner_text("#engine-status")
    page.locator("#engine-profile").get_by_text("#2 quality / speed", exact=False).click()
    page.click("#engine-switch")
    page.click("#engine-switch")  # double click: refused, never a second engine
    page.wait_for_selector('[data-testid="engine-state"]:not([data-state="ready"])', timeout=10_000)
    page.wait_for_selector('[data-testid="engine-state"][data-state="ready"][data-profile="balanced"]', timeout=40_000)
    assert state.engine.snapshot().profile_id == "balanced"
    page.wait_for_function("document.querySelector('#engine-log textarea').value.includes('delta tier')")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "engine-tab.png"), full_page=True)
    # Logs tab: live tail of the current engine, then the saved run of the previous (quality) engine
    page.get_by_role("tab", name="Logs").click()
    page.wait_for_function("document.querySelector('#logs-text textarea').value.includes('Application startup complete')")
    page.click("#logs-refresh")
    saved = [r for r in state.engine.logs.runs() if "-quality-" in r]
    assert saved, state.engine.logs.runs()
    page.locator("#logs-source input").click()
    page.get_by_role("option", name=saved[0]).click()
    page.fill("#logs-filter textarea", "delta tier")
    page.press("#logs-filter textarea", "Enter")
    page.wait_for_function(  # the filtered saved run: only matching lines remain
        "(() => { const v = document.querySelector('#logs-text textarea').value;"
        " return v.includes('moe_w2 delta tier') && v.split('\\n').every(l => l.includes('delta tier')); })()")
    text = page.input_value("#logs-text textarea")
    assert all("delta tier" in ln for ln in text.splitlines())
    page.screenshot(path=str(ARTIFACTS / "logs-tab.png"), full_page=True)
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors
