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


def test_reload_radio_follows_the_serving_profile_and_logs_follow_and_filter(engine_panel, browser) -> None:
    """Issue 11: after a reload the selector names what serves; the Logs view hides the panel's own probe
    lines by default (toggle shows them) and stays pinned to the newest line while following."""
    url, state = engine_panel
    t = state.engine.start("balanced")  # as if started before this page (or from the CLI)
    assert t.wait(60) and t.ok, t.message
    page = browser.new_page(1280, 1000)
    page.set_default_timeout(60_000)  # a loaded shared CI box: clicks wait for Gradio's re-render
    page.goto(url)
    page.get_by_role("tab", name="Engine").click()
    page.wait_for_selector('[data-testid="engine-state"][data-state="ready"][data-profile="balanced"]', timeout=20_000)
    page.wait_for_function("() => { const r = document.querySelector('#engine-profile input:checked');"
                           " return r && r.value === 'balanced'; }", timeout=10_000)
    assert page.locator("#engine-start").is_disabled()  # nothing to start over a ready engine
    assert not page.locator("#engine-overrides").is_visible()  # no failing item, no "Start anyway"
    page.reload()  # not "networkidle": the page timer and the queue stream never leave the network idle
    page.wait_for_selector("#main-tabs")
    page.get_by_role("tab", name="Engine").click()
    page.wait_for_function("() => { const r = document.querySelector('#engine-profile input:checked');"
                           " return r && r.value === 'balanced'; }", timeout=10_000)

    page.get_by_role("tab", name="Logs").click()
    page.wait_for_function("document.querySelector('#logs-text textarea').value.includes('Application startup')")
    # the panel polls /health and /metrics every second: those access lines exist in the tail ...
    assert any('"GET /health' in ln.text or '"GET /metrics' in ln.text for ln in state.engine.recent_logs(5000))
    text = page.input_value("#logs-text textarea")
    assert '"GET /metrics' not in text and '"GET /health' not in text  # ... and are hidden by default
    page.locator("#logs-probes input").check()
    page.wait_for_function("document.querySelector('#logs-text textarea').value.includes('GET /')", timeout=15_000)
    # follow live: pinned to the bottom as lines arrive
    page.wait_for_function("() => { const ta = document.querySelector('#logs-text textarea');"
                           " return ta.scrollHeight > ta.clientHeight &&"
                           " ta.scrollHeight - ta.scrollTop - ta.clientHeight < 30; }", timeout=20_000)
