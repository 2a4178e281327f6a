"""In Chromium: a stopped engine is a hole in the engine plots, not a line, and the band above the plots
names the stop / start / switch (issue 29). The timeline holds a recorded journey (ready, 4 min stopped,
start, switch); the hub is closed first so live samples cannot interleave with it."""

from __future__ import annotations

import io
import time

import pytest

from app.backend.telemetry.timeline import Timeline, TimelinePoint
from tests.conftest import ARTIFACTS
from tests.telemetry.test_plot_gaps import _journey
from tests.telemetry.test_ui_browser import panel  # noqa: F401  (the demo-panel fixture)

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _blue_columns(png: bytes, box: dict) -> list[int]:
    """x of every column holding the first series' colour (#3182ce) inside `box`."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    crop = img.crop((int(box["x"]), int(box["y"]), int(box["x"] + box["width"]), int(box["y"] + box["height"])))
    w, h = crop.size
    px = crop.load()
    return [x for x in range(w) if any(abs(px[x, y][0] - 0x31) < 40 and abs(px[x, y][1] - 0x82) < 40
                                       and abs(px[x, y][2] - 0xCE) < 40 for y in range(h))]


def test_a_stopped_engine_is_a_hole_and_the_band_names_stop_start_switch(panel, browser) -> None:  # noqa: F811
    hub = panel.state.telemetry
    hub.close()
    tl = Timeline()
    shift = time.time() - 405  # the recorded journey, ending now
    for p in _journey():
        tl.append(TimelinePoint(**{**{f: getattr(p, f) for f in p.__slots__}, "ts": p.ts - 1000 + shift}))
    hub.timeline = tl
    page = browser.new_page(1400, 2100)  # every plot inside the viewport
    page.goto(panel.url)
    page.get_by_role("tab", name="Telemetry").click()
    page.wait_for_function("() => { const e = document.querySelector('#telemetry-events');"
                           " return e && +e.dataset.events >= 5 }", timeout=30_000)
    band = page.inner_text("#telemetry-events")
    assert "stopped" in band and "start balanced" in band and "ready speed" in band, band
    # TTFT is drawn from the first sample (left end of the blue) to the last (right end): the stopped engine
    # spans 15–76 % of that time; the columns at 25–65 % of it must hold no line.
    hole: list[int] = []
    cols: list[int] = []
    for _ in range(40):
        cols = _blue_columns(page.screenshot(), page.locator("#telemetry-plot-ttft").bounding_box())
        if cols and cols[-1] - cols[0] > 100:
            lo, hi = cols[0], cols[-1]
            hole = [x for x in cols if lo + 0.25 * (hi - lo) <= x <= lo + 0.65 * (hi - lo)]
            break
        page.wait_for_timeout(250)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "telemetry-gaps.png"), full_page=True)
    assert cols and cols[-1] - cols[0] > 100, f"no TTFT line drawn: {cols}"
    assert hole == [], f"a line drawn across the stopped engine at columns {hole[:5]}…"
