"""Headless Chromium clicks Start, then Switch, in the Engine tab and sees the state badge reach ready."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS, serving

from .conftest import sim_panel_state

pytestmark = [pytest.mark.browser, pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def engine_panel(docker_client, tmp_path: Path):
    with sim_panel_state(docker_client, tmp_path / "data") as state, serving(state) as panel:
        yield panel.url, state


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
    # a double click: the second click lands while the first is handled (a plain second click would wait
    # for the button, which the first click disables), and it must never start a second engine
    page.dblclick("#engine-switch")
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
    page.reload()  # not "networkidle": the page feed's stream never leaves the network idle
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


@pytest.fixture
def home_engine_panel(docker_client):
    """engine_panel with its data dir where users keep theirs (~/.local/share/moet-panel-test-*/data)."""
    from tests.journey.conftest import user_data_dir

    with user_data_dir() as data, sim_panel_state(docker_client, data) as state:
        with serving(state) as panel:
            yield panel.url, state, panel.blocks
        # the UI's one watch, the hub's, the chat's and the alert service's queue ended with the panel
        assert state.engine.events.subscribers == 0


# What the server sends an open page: Gradio's client reads its queue's event stream with fetch; this copy
# of each /queue/data stream counts, per view, the messages that carry that view's HTML again.
COUNT_SENT_JS = """(() => {
  window.__sent = {header: 0, status: 0, diag: 0, messages: 0};
  const marks = [['header', 'moet-header-strip'], ['status', 'engine-status-box'], ['diag', 'No failure recorded']];
  const realFetch = window.fetch.bind(window);
  window.fetch = async (...args) => {
    const resp = await realFetch(...args);
    const url = String(args[0] && args[0].url ? args[0].url : args[0]);
    if (!url.includes('/queue/data') || !resp.body) return resp;
    const [mine, theirs] = resp.body.tee();
    (async () => {
      const reader = mine.getReader(), dec = new TextDecoder();
      let buf = '';
      for (;;) {
        const {done, value} = await reader.read();
        if (done) return;
        buf += dec.decode(value, {stream: true});
        let at;
        while ((at = buf.indexOf('\\n\\n')) >= 0) {  // one SSE message
          const msg = buf.slice(0, at); buf = buf.slice(at + 2);
          window.__sent.messages += 1;
          for (const [name, mark] of marks) if (msg.includes(mark)) window.__sent[name] += 1;
        }
      }
    })();
    return new Response(theirs, {status: resp.status, statusText: resp.statusText, headers: resp.headers});
  };
})()"""

# When the header's engine state moved (page clock), how often the header was written, and how many event
# POSTs the page sent (Gradio's queue/join: one per event).
OBSERVE_JS = """() => {
  window.__moet = {writes: 0, posts: 0, states: []};
  const realFetch = window.fetch.bind(window);
  window.fetch = (...args) => {
    const url = String(args[0] && args[0].url ? args[0].url : args[0]);
    if (url.includes('/queue/join')) window.__moet.posts += 1;
    return realFetch(...args);
  };
  new MutationObserver(records => {
    const header = document.querySelector('#moet-header');
    if (records.some(r => header.contains(r.target))) window.__moet.writes += 1;
    const h = document.querySelector('[data-testid="hdr-engine"]');
    const st = window.__moet.states;
    if (h && (!st.length || st[st.length - 1][1] !== h.dataset.state)) st.push([Date.now() / 1000, h.dataset.state]);
  }).observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true});
}"""


def test_idle_page_is_not_redrawn_and_an_engine_change_shows_at_once(home_engine_panel, browser) -> None:
    """Issues 32 and 42: an idle page gets nothing and sends nothing — no page timer, no event POST, the
    header and the Engine tab's state views not written — while the page feed checks every second; a change
    (a stop) still shows within the feed's period."""
    url, state, blocks = home_engine_panel
    from app.ui.app import FEED_ATTR

    versions = getattr(blocks, FEED_ATTR).versions
    page = browser.new_page(1280, 1000)
    page.add_init_script(COUNT_SENT_JS)
    page.goto(url)
    page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached", timeout=60_000)
    page.get_by_role("tab", name="Engine").click()
    page.wait_for_selector('[data-testid="engine-state"][data-state="stopped"]')
    page.wait_for_selector('[data-testid="hdr-engine"][data-state="stopped"]')
    subscribers = state.engine.events.subscribers  # one per consumer (the UI's, hub, chat, alert service ...)
    page.wait_for_function("() => window.__moetFeed && Object.keys(window.__moetFeed.latest).length > 0")
    page.evaluate(OBSERVE_JS)

    def feed_checks(n: int) -> None:  # the feed's own clock: n more computations of the versions
        seen, deadline = versions.computed, time.monotonic() + 60
        while versions.computed < seen + n:
            assert time.monotonic() < deadline, "the page feed stopped computing"
            page.wait_for_timeout(200)

    feed_checks(3)  # the tab's own opening events (Gradio's select listeners) are answered
    page.evaluate("() => { for (const k in window.__sent) window.__sent[k] = 0; window.__moet.posts = 0;"
                  " window.__moet.writes = 0; for (const k in window.__moetFeed.pressed) delete window.__moetFeed.pressed[k]; }")
    # idle: eight checks of the feed (one a second) with this page connected ...
    feed_checks(8)
    moet = page.evaluate("() => window.__moet")
    sent = page.evaluate("() => window.__sent")
    pressed = page.evaluate("() => window.__moetFeed.pressed")
    assert moet["posts"] == 0 and moet["writes"] == 0, (moet, pressed)  # ... no event sent, the header not written
    assert (sent["header"], sent["status"], sent["diag"]) == (0, 0, 0), sent
    assert state.engine.events.subscribers == subscribers  # redraws subscribe nothing per page or per check
    # a change: the engine starts (from this process, as the CLI's would be adopted), then stops
    assert state.engine.start("quality").accepted
    page.wait_for_selector('[data-testid="hdr-engine"][data-state="ready"]', timeout=60_000)
    page.wait_for_selector('[data-testid="engine-state"][data-state="ready"]', timeout=10_000)
    page.evaluate("() => { window.__moet.states = []; }")
    sub = state.engine.subscribe()
    try:
        assert state.engine.stop().accepted
        ev = None
        while ev is None or ev.after.state.value != "stopped":
            ev = sub.get(timeout=30)
            assert ev is not None, "no stopped event within 30 s"
    finally:
        sub.close()
    # the header shows it within 3 feed periods of the event (the feed checks every second)
    page.wait_for_selector('[data-testid="hdr-engine"][data-state="stopped"]', timeout=3_000)
    page.wait_for_selector('[data-testid="engine-state"][data-state="stopped"]', timeout=1_000)
    shown = next(t for t, s in page.evaluate("() => window.__moet.states") if s == "stopped")
    assert shown - ev.ts < 3.0, (shown - ev.ts)
