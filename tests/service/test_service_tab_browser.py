"""The Service tab in headless Chromium: the restart policy is set in the panel, notification URLs are saved
(and never shown back unmasked), and "Send a test" reaches a real local HTTP receiver through Apprise."""

from __future__ import annotations

import pytest

from tests.service.test_notify import Receiver, receiver  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser]


def test_policy_urls_and_test_message_from_the_service_tab(panel, browser, receiver: Receiver) -> None:  # noqa: F811
    page = browser.new_page(1280, 1000)
    page.goto(panel.url)
    page.get_by_role("tab", name="Service").click()
    page.wait_for_selector("#service-status")
    assert "on-failure" in page.inner_text("#service-status")
    page.locator("#service-policy").get_by_text("never", exact=True).click()
    page.click("#service-save-policy")
    page.wait_for_function("document.querySelector('#service-note').innerText.includes('restart policy saved: never')")
    assert panel.state.engine.restart_policy() == "never"  # the supervisor reads it at once
    secret_url = receiver.url.replace("json://", "json://alice:hunter2secret@")
    page.fill("#service-urls textarea, #service-urls input", secret_url)
    page.click("#service-save-urls")
    page.wait_for_function("document.querySelector('#service-note').innerText.includes('saved 1 URL')")
    page.wait_for_function("document.querySelector('#service-status').innerText.includes('127.0.0.1')")
    assert "hunter2secret" not in page.content()
    page.click("#service-test")
    page.wait_for_function("document.querySelector('#service-note').innerText.includes('sent to json://')",
                           timeout=30_000)
    assert receiver.titles() == ["moet-panel: test notification"]
    assert "never" in page.inner_text("#service-status")
    browser.snap(page, "service-tab")
    assert not [e for e in browser.console_errors if "favicon" not in e]



def test_opening_the_service_tab_draws_what_is_true_now(panel) -> None:
    """Gradio mounts a tab's components when the tab opens, so the tab's own 3 s timer starts then: without a
    redraw on opening, a change made meanwhile (here the policy, as `moet-panel` in a terminal or a second
    panel would set it) stayed behind the page-load status for up to 3 s. The tab's select event draws it."""
    from types import SimpleNamespace

    from app.backend.service import panel as service
    from app.ui.app import build_ui

    demo = build_ui(panel.state)
    box = next(b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "service-status-box")
    on_open = [f for f in demo.fns.values() if any(ev == "select" for _, ev in f.targets) and box in f.outputs]
    assert on_open, "nothing redraws the Service status when its tab opens"
    assert service.set_policy(panel.state, "never").startswith("restart policy saved")
    try:
        drawn = [f.fn(SimpleNamespace(value="Service")) for f in on_open]
        assert any("never" in str(d) for d in drawn), drawn
        others = [f.fn(SimpleNamespace(value="Profiles")) for f in on_open]  # another tab: nothing redrawn
        assert not any("never" in str(d) for d in others), others
    finally:
        service.set_policy(panel.state, "on-failure")
