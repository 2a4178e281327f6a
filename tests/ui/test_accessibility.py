"""Every control has a label; the page fits 1280×800 and a 420 px-wide window; no console errors."""

from __future__ import annotations

import pytest

from tests.ui.a11y import horizontal_overflow, unlabelled_controls

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _open_everything(page) -> None:
    page.wait_for_selector("#profile-cards")
    for acc in ("Studies behind the figures", "Custom profile: clone"):
        page.get_by_text(acc, exact=False).first.click()
    page.wait_for_selector("#custom-name textarea, #custom-name input")


@pytest.mark.parametrize("size", [(1280, 800), (420, 860)], ids=["desktop", "narrow"])
def test_controls_labelled_and_no_horizontal_overflow(shared_panel, browser, size) -> None:
    page = browser.new_page(*size)
    page.goto(shared_panel.url)
    _open_everything(page)
    missing = unlabelled_controls(page)
    assert not missing, f"controls without an accessible name: {missing}"
    overflow = horizontal_overflow(page)
    assert overflow["page"] <= 1 and overflow["main"] <= 1, overflow
    assert not browser.console_errors, browser.console_errors
