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
