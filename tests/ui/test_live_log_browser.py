"""Issue 49, "the page at its floor" (docs/ui-and-safety.md): the Engine tab's and the Logs tab's live log tails
come as text on the page feed, not as Gradio events. A new line reaches a shown box with no event sent (no
/queue/join), in the view the page shows (its filter, its stream), the Logs box stays pinned to the newest line
while following, and a saved run's text is left alone by the live feed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.backend.contracts import LogLine
from tests.conftest import Panel, close_panel, launch_panel
from tests.journey.conftest import user_data_dir
from tests.polling import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Counts the event requests the page sends (Gradio's queue/join: one per event).
COUNT_POSTS_JS = """() => {
  if (window.__posts !== undefined) return;  // installed once per page
  window.__posts = 0; window.__bodies = [];
  const realFetch = window.fetch.bind(window);
  window.fetch = (...args) => {
    const url = String(args[0] && args[0].url ? args[0].url : args[0]);
    if (url.includes('/queue/join')) { window.__posts += 1; window.__bodies.push(String(args[1] && args[1].body).slice(0, 300)); }
    return realFetch(...args);
  };
}"""


@pytest.fixture(scope="module")
def log_panel() -> Iterator[Panel]:
    """A demo panel (engine stopped) whose log store gets its lines from the test."""
    with user_data_dir() as data:
        p = launch_panel(data)
        try:
            logs = p.state.engine.logs
            logs.begin_run("moet-test-saved-run", time.time() - 60)  # a run kept on disk, for the Run list
            logs.append(LogLine("a line of the saved run"))
            logs.begin_run("moet-test-live-log", time.time(), persist=False)
            yield p
        finally:
            close_panel(p)


def add(panel: Panel, *texts: str, stream: str = "stdout") -> None:
    for t in texts:
        panel.state.engine.logs.append(LogLine(t, stream), persist=False)  # type: ignore[arg-type]


def box(page: Any, sel: str) -> str:
    return str(page.evaluate(f"() => document.querySelector('{sel} textarea').value"))


def shows(page: Any, sel: str, text: str, timeout: float = 15.0) -> None:
    wait_for(lambda: text in box(page, sel), timeout=timeout, what=f"{text!r} in {sel}")


def feed_periods(panel: Panel, n: int) -> None:
    """n more computations of the page feed's versions (one a second): the test's clock."""
    from app.ui.app import FEED_ATTR

    versions = getattr(panel.blocks, FEED_ATTR).versions
    seen = versions.computed
    wait_for(lambda: versions.computed >= seen + n, timeout=30, what=f"{n} page feed periods")


def settled(page: Any, panel: Panel, topic: str) -> None:
    """The tab's opening is drawn: its stream is open, and its opening's events (Gradio's tab select listeners,
    one request each) are answered: no request for three feed periods. Then the page's requests are counted."""
    wait_for(lambda: page.evaluate(f"() => window.__moetFeed.stream().includes('show={topic}')"), timeout=20,
             what=f"the {topic} tab's stream")
    page.evaluate(COUNT_POSTS_JS)
    for _ in range(20):
        before = page.evaluate("() => window.__posts")
        feed_periods(panel, 3)
        if page.evaluate("() => window.__posts") == before:
            break
    else:
        raise AssertionError("the page kept sending events")
    page.evaluate("() => { window.__posts = 0; window.__bodies = []; }")


def test_a_new_log_line_reaches_both_tails_without_an_event(log_panel, browser) -> None:
    panel = log_panel
    add(panel, *(f"boot line {i}" for i in range(40)))
    page = browser.new_page(1280, 1000)
    page.goto(panel.url)
    page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached", timeout=60_000)

    page.get_by_role("tab", name="Engine", exact=True).click()
    shows(page, "#engine-log", "out | boot line 39")
    settled(page, panel, "engine")
    # a filter applied (Enter): the box shows its lines at once (Gradio's submit), and the feed follows that view
    page.fill("#engine-log-filter textarea", "throughput")
    page.press("#engine-log-filter textarea", "Enter")
    wait_for(lambda: box(page, "#engine-log") == "(no lines)" or box(page, "#engine-log") == "",
             timeout=15, what="the filtered tail (no line matches yet)")
    wait_for(lambda: "needle=throughput" in page.evaluate("() => window.__moetFeed.stream()"), timeout=10,
             what="a stream for the filtered view")
    page.evaluate("() => { window.__posts = 0; window.__bodies = []; }")  # the submit's own request: counted out
    add(panel, "Engine 000: Avg prompt throughput: 0.0 tokens/s", stream="stderr")
    add(panel, "boot line 40", 'INFO:     127.0.0.1:40000 - "GET /metrics?throughput HTTP/1.1" 200 OK')
    shows(page, "#engine-log", "err | Engine 000: Avg prompt throughput: 0.0")
    # only the view's lines: not the other line, nor the panel's own probe (hidden unless asked for)
    assert box(page, "#engine-log") == "err | Engine 000: Avg prompt throughput: 0.0 tokens/s"
    assert page.evaluate("() => window.__posts") == 0, page.evaluate("() => window.__bodies")

    page.get_by_role("tab", name="Logs", exact=True).click()
    shows(page, "#logs-text", "out | boot line 40")
    settled(page, panel, "logs")
    add(panel, *(f"more {i}" for i in range(30)))
    shows(page, "#logs-text", "out | more 29")
    # following: pinned to the newest line, as the Gradio update did (its change listener runs the Follow script)
    wait_for(lambda: page.evaluate("() => { const t = document.querySelector('#logs-text textarea');"
                                   " return t.scrollHeight > t.clientHeight"
                                   " && t.scrollHeight - t.scrollTop - t.clientHeight < 30; }"),
             timeout=10, what="the Logs box pinned to the newest line")
    assert page.evaluate("() => window.__posts") == 0
    # Follow live off: the box is left as it is
    page.locator("#logs-follow input").uncheck()
    wait_for(lambda: "follow=0" in page.evaluate("() => window.__moetFeed.stream()"), timeout=10,
             what="a stream for the paused view")
    add(panel, "while paused")
    feed_periods(panel, 3)
    assert "while paused" not in box(page, "#logs-text")
    page.locator("#logs-follow input").check()
    shows(page, "#logs-text", "out | while paused")
    # a saved run picked: its lines, and the live feed leaves them alone
    page.click("#logs-refresh")
    saved = [r for r in panel.state.engine.logs.runs() if "moet-test-saved-run" in r]
    assert saved, panel.state.engine.logs.runs()
    page.locator("#logs-source input").click()
    page.get_by_role("option", name=saved[0]).click()
    shows(page, "#logs-text", "out | a line of the saved run")
    wait_for(lambda: "source=moet-test-saved-run" in page.evaluate("() => window.__moetFeed.stream()"), timeout=10,
             what="a stream for the saved run's view")
    add(panel, "live while a saved run is shown")
    feed_periods(panel, 3)
    assert box(page, "#logs-text") == "out | a line of the saved run"
    assert not browser.console_errors, browser.console_errors
