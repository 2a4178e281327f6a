"""Issue 42, the newcomer's rough edges that show in the page (demo panel, headless Chromium): Telemetry's
empty plots say "no data yet" and every drawn plot shows one time range; the equivalent `docker run` wraps
in its box; a chat export's file name shows in full; at 420 px the header leaves room for the tab's content
and Downloads does not overflow."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.conftest import Panel, close_panel, launch_panel
from tests.journey.conftest import user_data_dir
from tests.ui.a11y import horizontal_overflow

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LONG_TITLE = "Explain the FP4 delta tier and how the pool promotes experts under load"


@pytest.fixture(scope="module")
def demo_home_panel() -> Iterator[Panel]:
    with user_data_dir() as data:
        p = launch_panel(data)
        try:
            yield p
        finally:
            close_panel(p)


def test_telemetry_empty_plots_say_no_data_yet_and_share_one_time_range(demo_home_panel, browser) -> None:
    page = browser.new_page(1280, 900)
    page.goto(demo_home_panel.url)
    page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached")
    page.get_by_role("tab", name="Telemetry").click()
    # the GPU plots have samples (the simulated GPU is sampled with the engine stopped); the engine's do not
    page.wait_for_function("() => Object.keys(window.__moetPlots?.ranges() || {}).length >= 2", timeout=30_000)
    page.wait_for_function("() => document.querySelector('#telemetry-plot-vram').dataset.points > 1")
    empty = page.evaluate("() => [...document.querySelectorAll('#telemetry-plots [data-plot]')].filter(e =>"
                          " e.querySelector('.moet-plot-empty').offsetParent !== null).map(e => e.id)")
    assert "telemetry-plot-ttft" in empty and "telemetry-plot-speed" in empty, empty
    for pid in empty:
        assert page.inner_text(f"#{pid}").strip() == "no data yet"
        assert "0.000000" not in page.inner_text(f"#{pid}")
    ranges = page.evaluate("() => window.__moetPlots.ranges()")
    assert len({tuple(round(v / 1000) for v in r) for r in ranges.values()}) == 1, ranges  # one time range
    lo, hi = next(iter(ranges.values()))
    assert 899 <= (hi - lo) / 1000 <= 901  # the window (15 min), ending now — not each plot's own data
    assert not browser.console_errors, browser.console_errors


@pytest.mark.parametrize("width", [1280, 700])
def test_the_docker_run_box_wraps_instead_of_scrolling_sideways(demo_home_panel, browser, width) -> None:
    page = browser.new_page(width, 900)
    page.goto(demo_home_panel.url)
    page.wait_for_selector("#profile-command textarea")
    page.wait_for_function("() => document.querySelector('#profile-command textarea').value.includes('docker run')")
    sw, cw = page.evaluate("() => { const t = document.querySelector('#profile-command textarea');"
                           " return [t.scrollWidth, t.clientWidth]; }")
    assert sw <= cw + 1, f"the docker run box scrolls sideways: {sw} px in {cw}"


def test_a_chat_export_shows_its_whole_file_name(demo_home_panel, browser) -> None:
    chat = demo_home_panel.state.chat
    conv = chat.new_conversation(title=LONG_TITLE)
    page = browser.new_page(1280, 900)
    page.goto(demo_home_panel.url)
    page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached")
    page.get_by_role("tab", name="Chat").click()
    page.locator("#chat-convs label", has_text=LONG_TITLE[:20]).first.click()
    page.click("#chat-export-json")
    stem = page.locator("#chat-export-file .stem").first
    stem.wait_for()
    assert stem.inner_text().startswith("Explain-the-FP4-delta-tier"), stem.inner_text()
    assert conv.id[:8] in stem.inner_text()
    sw, cw = stem.evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert sw <= cw + 1, f"the file name is cut: {sw} px in {cw}"


def test_at_420_px_the_header_leaves_room_and_downloads_fit(demo_home_panel, browser) -> None:
    page = browser.new_page(420, 860)
    page.goto(demo_home_panel.url)
    page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached")
    page.wait_for_selector('[data-testid="hdr-engine"]')
    top = page.evaluate("() => document.querySelector('#tab-profiles').getBoundingClientRect().top + window.scrollY")
    assert top <= 400, f"the tab's content starts {top:.0f} px down (banner, header strip and tab names)"
    page.get_by_role("tab", name="Downloads").click()
    page.locator("#tab-downloads").wait_for(state="visible")
    page.wait_for_selector("#dl-table table, #dl-table .moet-dl")
    overflow = horizontal_overflow(page)
    assert overflow["page"] <= 0 and overflow["main"] <= 0, overflow


def test_a_page_in_the_background_holds_no_stream_and_catches_up_when_shown(demo_home_panel, browser) -> None:
    """Issue 42: `document.visibilityState` hidden → the page drops its feed (nothing runs for it); shown
    again → a new stream whose first line brings what changed meanwhile, drawn at once."""
    from app.ui.app import FEED_ATTR

    feed = getattr(demo_home_panel.blocks, FEED_ATTR)
    page = browser.new_page(1280, 900)
    page.goto(demo_home_panel.url)
    page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached")
    page.wait_for_function("() => window.__moetFeed && Object.keys(window.__moetFeed.latest).length > 0")
    assert feed.open >= 1
    before = feed.open
    set_visibility = ("(v) => { Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => v});"
                      " document.dispatchEvent(new Event('visibilitychange')); }")
    page.evaluate(set_visibility, "hidden")
    deadline = time.monotonic() + 10
    while feed.open >= before:
        assert time.monotonic() < deadline, "the hidden page kept its stream"
        page.wait_for_timeout(50)
    # meanwhile a conversation is made elsewhere: the Chat tab's version moves
    demo_home_panel.state.chat.new_conversation(title="made while the page was hidden")
    page.evaluate(set_visibility, "visible")
    deadline = time.monotonic() + 10
    while feed.open < before:
        assert time.monotonic() < deadline, "the page did not open its stream again"
        page.wait_for_timeout(50)
    page.get_by_role("tab", name="Chat").click()
    page.locator("#chat-convs", has_text="made while the page was hidden").wait_for(timeout=15_000)
