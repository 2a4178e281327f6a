"""Issue 49, "the page at its floor" (docs/ui-and-safety.md, "The page feed"): an idle tab whose figures do not
move writes nothing to its DOM, sends no request and asks for no animation frame (Gradio 6.31's leaked
loading-timer loop asked for 60 a second: assets/js/idle-frames.js); a figure that moves reaches the header as
text and attributes set in place, not as a new strip. Counts over a window of the page feed's own clock (its
versions computed N more times), never CPU time."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest

from app.backend.contracts import GiB
from tests.conftest import Panel, close_panel, launch_panel
from tests.journey.conftest import user_data_dir

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# Installed before the page's own scripts (an init script): frames reaching Chromium's requestAnimationFrame (the
# page's idle-frames.js wraps this one, so a step it moves to its timer is not counted), DOM mutation records
# (where, and of which kind), and every request the page starts (fetch, XHR, EventSource, resources: CDP below).
COUNT_JS = """(() => {
  const frame = window.requestAnimationFrame.bind(window);
  window.__idle = {frames: 0, records: [], on: false};
  window.requestAnimationFrame = (cb) => { if (window.__idle.on) window.__idle.frames += 1; return frame(cb); };
  const observe = () => new MutationObserver(rs => {
    if (!window.__idle.on) return;
    for (const r of rs) {
      const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
      window.__idle.records.push({type: r.type, header: !!(el && el.closest('#moet-header')),
                                  where: el ? (el.closest('[id]') || {}).id || el.tagName : '?',
                                  what: el ? el.outerHTML.slice(0, 160) : '', attr: r.attributeName || ''});
    }
  }).observe(document, {subtree: true, childList: true, characterData: true, attributes: true});
  if (document.documentElement) observe(); else document.addEventListener('DOMContentLoaded', observe);
})()"""


@pytest.fixture(scope="module")
def held_panel() -> Iterator[tuple[Panel, list[Any]]]:
    """A demo panel (engine stopped) whose telemetry frame is held: `frame[0]` is what the header reads."""
    with user_data_dir() as data:
        p = launch_panel(data)
        try:
            hub = p.state.telemetry
            deadline = time.monotonic() + 30
            while not hub.latest().gpus:  # the SIMULATED GPU's first sample
                assert time.monotonic() < deadline, "no GPU sample within 30 s"
                time.sleep(0.1)
            frame = [hub.latest()]
            hub.latest = lambda: frame[0]  # the header's figures stay as they are until the test moves them
            yield p, frame
        finally:
            close_panel(p)


def feed_checks(page: Any, panel: Panel, n: int) -> None:
    """Wait for n more computations of the page feed's versions (one a second): the window's clock."""
    from app.ui.app import FEED_ATTR

    versions = getattr(panel.blocks, FEED_ATTR).versions
    seen, deadline = versions.computed, time.monotonic() + 60
    while versions.computed < seen + n:
        assert time.monotonic() < deadline, "the page feed stopped computing"
        page.wait_for_timeout(200)


def test_an_idle_tab_writes_nothing_and_a_moved_figure_is_set_as_text(held_panel, browser) -> None:
    panel, frame = held_panel
    page = browser.new_page(1280, 900)
    page.add_init_script(COUNT_JS)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(panel.url)
    page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached", timeout=60_000)
    page.wait_for_function("() => window.__moetFeed && Object.keys(window.__moetFeed.latest).length > 0")
    used = page.get_attribute('[data-testid="hdr-vram"]', "data-vram-used")
    # the page's load events and the feed's first message are drawn, and Gradio's screen-reader line has said
    # "Complete" for them and cleared it (it speaks at most every 5 s, and clears after 1 s)
    feed_checks(page, panel, 8)
    page.evaluate("() => { window.__idle.on = true; }")
    requests.clear()

    feed_checks(page, panel, 8)  # idle, nothing moved: eight checks of the feed with this page connected
    idle = page.evaluate("() => window.__idle")
    assert idle["records"] == [], idle["records"][:20]  # no DOM write at all
    assert requests == [], requests  # no event, no poll
    assert idle["frames"] == 0, idle["frames"]  # no animation frame asked for (Gradio's timer loop: 60 a second)
    assert page.evaluate("() => window.__moetFrames.slowed") > 0  # the loop is there, once a second, frameless

    # a figure moves (2 GiB more VRAM in use): the header shows it within a few feed periods ...
    held = frame[0]
    frame[0] = dataclasses.replace(held, gpus=tuple(dataclasses.replace(g, memory_used=g.memory_used + 2 * GiB)
                                                    for g in held.gpus))
    want = f"{round(frame[0].vram_used_gib or 0.0, 1):.1f}"
    assert want != used
    page.wait_for_selector(f'[data-testid="hdr-vram"][data-vram-used="{want}"]', timeout=5_000)
    assert f"{want} / " in page.inner_text('[data-testid="hdr-vram"]')
    feed_checks(page, panel, 2)
    moved = page.evaluate("() => window.__idle")
    # ... as text and attributes set in place (the figure, its data attribute, the bar's width): no node made or
    # removed, nothing written outside the header, no request, no frame
    kinds = {r["type"] for r in moved["records"]}
    assert kinds <= {"characterData", "attributes"}, moved["records"]
    assert all(r["header"] for r in moved["records"]), moved["records"]
    assert 1 <= len(moved["records"]) <= 4, moved["records"]
    assert requests == [] and moved["frames"] == 0, (requests, moved["frames"])
    assert not browser.console_errors, browser.console_errors
