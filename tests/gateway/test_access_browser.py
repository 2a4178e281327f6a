"""Headless Chromium on the Access tab: switch the gateway on, create a key (shown once), use it with the real
`openai` SDK through the gateway to the SIMULATED engine (real Docker), see usage and activity, revoke it."""

from __future__ import annotations

import dataclasses

import openai
import pytest

from app.backend.contracts import EngineState
from tests.conftest import free_port, serving
from tests.engine.conftest import docker_client, sim_panel_state  # noqa: F401 (fixture)
from tests.polling import wait_for
from tests.gateway.conftest import key_refused

pytestmark = [pytest.mark.browser, pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def access_panel(docker_client, tmp_path_factory: pytest.TempPathFactory):  # noqa: F811 (the fixture above)
    home = tmp_path_factory.mktemp("home")
    with sim_panel_state(docker_client, home / ".local" / "share" / "moet-panel" / "data") as state:
        state.gateway.config = dataclasses.replace(state.gateway.config, port=free_port())
        with serving(state) as panel:
            yield panel.url, state


def test_access_tab_switch_create_use_revoke(access_panel, browser) -> None:
    url, state = access_panel
    assert state.engine.start("quality").accepted
    page = browser.new_page(1280, 1100)
    page.goto(url)
    page.get_by_role("tab", name="Access").click()
    page.wait_for_selector('#gw-status[data-state="off"]')
    page.locator("#gw-switch input").check()
    page.wait_for_selector('#gw-status[data-state="on"]')
    gw_url = page.inner_text("#gw-url")
    assert gw_url == f"http://127.0.0.1:{state.gateway.config.port}/v1"
    # the snippets carry the address and a placeholder, never a key
    page.get_by_text("Client snippets").click()
    page.wait_for_function("() => document.querySelector('#gw-python')?.innerText.includes('YOUR_KEY')")
    assert gw_url in page.inner_text("#gw-python")

    page.fill("#gw-key-name textarea", "laptop")
    page.click("#gw-create")
    page.wait_for_function("() => (document.querySelector('#gw-new-key textarea')?.value || '').startsWith('mpk-')")
    key = page.input_value("#gw-new-key textarea")
    assert page.locator("#gw-new-key button[aria-label*='opy'], #gw-new-key button[title*='opy']").count() >= 1
    page.wait_for_selector("#gw-keys tr[data-key='laptop']")

    wait_for(lambda: state.engine.snapshot().state is EngineState.READY, 60, "the engine ready")
    with openai.OpenAI(base_url=gw_url, api_key=key, max_retries=0, timeout=30) as c:
        r = c.chat.completions.create(model="deepseek-v4-flash", messages=[{"role": "user", "content": "hi"}],
                                      max_tokens=24)
        chunks = list(c.chat.completions.create(model="deepseek-v4-flash", stream=True, max_tokens=16,
                                                messages=[{"role": "user", "content": "and a stream"}]))
    assert r.usage.completion_tokens == 24 and chunks
    page.wait_for_function("() => document.querySelectorAll('#gw-activity tbody tr').length >= 2", timeout=15_000)
    # the owner's key, beside the panel's own for its Chat tab (docs/chat.md "Taking turns")
    assert {i.name for i in state.gateway.list_keys()} == {"laptop", "panel-chat"}
    info = next(i for i in state.gateway.list_keys() if i.name == "laptop")
    assert (info.usage.requests, info.usage.completion_tokens, info.usage.errors) == (2, 40, 0)
    assert [a.status for a in state.gateway.activity()] == [200, 200]  # a stream read to its end is no abort
    page.wait_for_function("() => document.querySelector(\"#gw-keys tr[data-key='laptop']\")?.innerText.includes('40')")
    browser.snap(page, "access-tab", docs="access")

    # shown once: a fresh page has the key nowhere, and neither does the panel's state dir (a new page,
    # not a reload: a reload aborts the old page's open requests, which Gradio logs as console errors)
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors
    page.close()
    page = browser.new_page(1280, 1100)
    page.goto(url)
    page.get_by_role("tab", name="Access").click()
    page.wait_for_selector("#gw-keys tr[data-key='laptop']")
    assert key not in page.content()
    assert not page.locator("#gw-new-key").is_visible()
    # the reloaded page shows the switch as the gateway is: on
    page.wait_for_function("() => document.querySelector('#gw-switch input')?.checked === true")
    state_dir = state.settings.state_dir
    assert all(key.encode() not in p.read_bytes() for p in state_dir.rglob("*") if p.is_file())

    page.locator("#gw-revoke-name input").click()
    page.get_by_role("option", name="laptop").click()
    page.click("#gw-revoke")
    page.wait_for_function("() => document.querySelector(\"#gw-keys tr[data-key='laptop']\")?.innerText.includes('revoked')")
    with openai.OpenAI(base_url=gw_url, api_key=key, max_retries=0, timeout=10) as c:
        wait_for(lambda: key_refused(c), 1.0, "the revoked key refused within 1 s")
    # caps (docs/gateway.md#caps) from the page: the gateway's for keys without their own, then one key's own
    page.get_by_text("Caps for keys without their own").click()
    page.fill("#gw-cap-tokens input", "1000")
    page.click("#gw-save-caps")
    page.wait_for_selector('#gw-caps[data-max-tokens="1000"]')
    assert "at most 1,000 tokens" in page.inner_text("#gw-caps")
    page.fill("#gw-key-name textarea", "ci")
    page.fill("#gw-key-cap input", "2000")
    page.click("#gw-create")
    page.wait_for_function("() => document.querySelector(\"#gw-keys tr[data-key='ci']\")?.innerText.includes('2,000')")
    ci = page.input_value("#gw-new-key textarea")
    ask = {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1500}
    with openai.OpenAI(base_url=gw_url, api_key=ci, max_retries=0, timeout=30) as c:
        assert c.chat.completions.create(**ask).choices  # its own cap (2,000) wins over the gateway's (1,000)
        browser.snap(page, "access-caps")
        page.locator("#gw-revoke-name input").click()
        page.get_by_role("option", name="ci").click()
        page.fill("#gw-set-cap-tokens input", "0")
        page.click("#gw-set-cap")  # empty: the gateway's cap again
        page.wait_for_function("() => document.querySelector(\"#gw-keys tr[data-key='ci']\")?.innerText.includes(\"gateway's\")")

        def refused() -> str:
            try:
                c.chat.completions.create(**ask)
                return ""
            except openai.BadRequestError as exc:
                return str(exc)

        assert "cap of 1000 tokens" in wait_for(refused, 2.0, "the gateway's cap again within 2 s")
    page.locator("#gw-switch input").uncheck()
    page.wait_for_selector('#gw-status[data-state="off"]')
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors
