"""Every tab (Profiles with its accordions open): controls labelled, no horizontal overflow at 1280×800 and 420 px, no console errors."""

from __future__ import annotations

import importlib

import pytest

from app.ui.app import TABS
from tests.ui.a11y import horizontal_overflow, unlabelled_controls

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.mark.parametrize("size", [(1280, 800), (420, 860)], ids=["desktop", "narrow"])
def test_every_tab_is_labelled_and_fits(shared_panel, browser, size) -> None:
    page = browser.new_page(*size)
    page.goto(shared_panel.url)
    page.wait_for_selector("#profile-cards")
    for accordion in ("Studies behind the figures", "Custom profile: clone"):  # their controls count too
        page.get_by_text(accordion, exact=False).first.click()
    page.wait_for_selector("#custom-name textarea, #custom-name input")
    problems: dict[str, object] = {}
    for name in TABS:
        module = importlib.import_module(name)
        if hasattr(module, "shown"):
            continue  # a tab only some panels have (the Fleet tab: a fleet's front); not on this demo panel
        tab_id = name.rsplit(".", 1)[-1]
        button = page.locator(f"#tab-{tab_id}-button")
        if button.count():
            button.click()
        else:  # narrow window: Gradio moves the tabs that do not fit into its "More tabs" menu
            page.get_by_role("button", name="More tabs").click()
            page.locator("#main-tabs .overflow-dropdown button", has_text=module.TITLE).click()
        page.locator(f"#tab-{tab_id}").wait_for(state="visible")
        browser.snap(page, f"tab-{tab_id}-{size[0]}")  # every tab at both sizes, to look at (README "Tests")
        missing = unlabelled_controls(page)
        overflow = horizontal_overflow(page)
        if missing or overflow["page"] > 1 or overflow["main"] > 1:
            problems[tab_id] = {"unlabelled": missing, "overflow": overflow}
    assert not problems, problems
    assert not browser.console_errors, browser.console_errors
