"""Headless Chromium: open the panel, switch to Profiles, select each profile, read its figures and command."""

from __future__ import annotations

import pytest

from app.backend.recipe import SIMULATED_RECIPE, load_recipe

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RECIPE = load_recipe(SIMULATED_RECIPE)
EXPECTED = {
    "quality": {"decode": "48.9 tok/s", "quality": "12.27 / 30", "delta": "— (reference)"},
    "balanced": {"decode": "75.0 tok/s", "quality": "10.90 / 30", "delta": "−1.37 /30 (90% CI [−2.48, −0.26])"},
    "speed": {"decode": "83.2 tok/s", "quality": "≈ half of #1", "delta": "−7.20 /30 (90% CI [−11.06, −3.34])"},
}


def test_profiles_view_shows_each_profile_and_its_command(panel, browser) -> None:
    page = browser.new_page(1280, 800)
    page.goto(panel.url)
    page.get_by_role("tab", name="Profiles").click()
    page.wait_for_selector("#profile-cards")
    assert "SIMULATED" in page.locator("#sim-banner").inner_text()
    assert page.locator("#speed-quality-chart svg circle").count() == 3
    for p in RECIPE.profiles:
        page.get_by_label(f"#{p.number} {p.title}", exact=True).check()
        card = page.locator(f'.moet-card.selected[data-profile="{p.id}"]')
        card.wait_for()
        got = {k: card.locator(f'[data-fig="{k}"]').inner_text() for k in ("decode", "quality", "delta")}
        assert got == EXPECTED[p.id]
        if p.recommended:
            assert "recommended" in card.inner_text()
        code = page.locator("#profile-command")
        page.wait_for_function(
            "pid => document.querySelector('#profile-command textarea').value.includes('moet-panel.profile=' + pid)", arg=p.id
        )
        text = code.locator("textarea").input_value()
        assert "docker run" in text and "VLLM_MOE_W2_DELTA_TRACE=1" in text and "moet-panel/sim-engine:2" in text
        if p.id == "balanced":
            assert "VLLM_MOE_W2_PROMO_HYST=8" in text
        if p.id == "speed":
            assert "VLLM_MOE_W2_DELTA_POLICY=need" in text
    # plain toggle: the card's command, no panel additions
    page.get_by_label("Plain: exactly the card's command", exact=False).check()
    page.wait_for_function("() => !document.querySelector('#profile-command textarea').value.includes('moet-panel.profile=')")
    assert "VLLM_MOE_W2_DELTA_TRACE" not in page.locator("#profile-command textarea").input_value()
    assert page.locator("#profile-command button[aria-label*='opy' i], #profile-command button[title*='opy' i]").count() >= 1
    why = page.locator("#command-why tr[data-why-source=card]")
    assert why.count() >= 8 and "VLLM_MOE_W2=1 — the 2-bit routed-expert path" in page.locator("#command-why").inner_text()
    assert "P(true effect is a real loss) ≈ 0.97" in page.locator('.moet-card[data-profile="balanced"]').inner_text()
    page.get_by_label("Plain: exactly the card's command", exact=False).uncheck()
    page.get_by_label("#2 quality / speed", exact=True).check()
    page.locator('.moet-card.selected[data-profile="balanced"]').wait_for()
    page.wait_for_function("() => document.querySelector('#command-why').innerText.includes('PROMO_HYST')")
    # docs/profiles.png: cards with the card's notes, the command, and the first reasons beside its lines
    assert page.locator("#command-why tbody tr").count() >= 15
    browser.snap(page, "profiles", docs="profiles", clip_to="#command-why tbody tr:nth-child(15)")
    browser.snap(page, "profiles-full")
    page.locator("#card-facts-box").get_by_text("Card facts: context").click()
    page.locator("#card-regenerate").wait_for()
    assert "does not start that boot" in page.locator("#card-regenerate").inner_text()
    page.locator("#studies").get_by_text("Studies behind the figures").click()
    page.locator(".moet-study table").first.wait_for()  # the accordion draws its content after the click
    assert page.locator(".moet-study table").count() == len(RECIPE.studies)
    assert not browser.console_errors, browser.console_errors
