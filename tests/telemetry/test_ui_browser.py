"""Demo mode in headless Chromium: the header strip and the Telemetry plots move live while the
SIMULATED engine serves traffic. Screenshots land in test-artifacts/ (look at them)."""

from __future__ import annotations

import io
import threading

import httpx
import pytest

from app.backend.engine.runtime.client import own_http
from tests.conftest import ARTIFACTS, close_panel, free_port, launch_panel

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PROMPT = "Summarise the trade-offs of an FP4 expert pool for a mixture-of-experts model. " * 25
PLOT_IDS = ("vram", "gpu", "power", "temp", "pool", "churn", "h2d", "kv", "speed", "prompt", "ttft", "requests")


def _blue_pixels(png: bytes, box: dict) -> int:
    """Pixels of the first series colour (#3182ce) inside `box`: a drawn line, not an empty frame.
    (Element screenshots would wait forever for the live plots to be 'stable': crop one page shot.)"""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    crop = img.crop((int(box["x"]), int(box["y"]), int(box["x"] + box["width"]), int(box["y"] + box["height"])))
    return sum(1 for r, g, b in crop.getdata() if abs(r - 0x31) < 40 and abs(g - 0x82) < 40 and abs(b - 0xCE) < 40)


@pytest.fixture
def panel(tmp_path):
    """Demo panel whose SIMULATED engine listens on a free port (8000 may be taken on a shared box)."""
    from app.backend.recipe import SIMULATED_RECIPE

    port = free_port()
    text = SIMULATED_RECIPE.read_text()
    assert text.count("port = 8000") == 1 and text.count('"--port", "8000"') == 1
    recipe = tmp_path / "simulated-port.toml"
    text = text.replace("port = 8000", f"port = {port}").replace('"--port", "8000"', f'"--port", "{port}"')
    recipe.write_text(text.replace('MOET_SIM_BOOT_S = "4"', 'MOET_SIM_BOOT_S = "1"'))  # the engine tests' 1 s boot
    data = tmp_path / "data"
    data.mkdir()
    p = launch_panel(data, recipe=recipe)
    try:
        yield p
    finally:
        close_panel(p)


def test_header_and_telemetry_plots_live_in_demo(panel, browser) -> None:
    engine = panel.state.engine
    page = browser.new_page(1400, 1600)
    done = threading.Event()
    try:
        page.goto(panel.url)
        page.wait_for_selector("#moet-header-strip")
        hdr = page.locator("[data-testid=hdr-vram]")
        assert "SIMULATED" in page.inner_text("#moet-header-strip")
        started = engine.start("quality")
        assert started.accepted, started
        snap = engine.wait_for(lambda s: s.is_ready or s.state.value == "failed", 60)
        assert snap.is_ready, snap.message

        http, root = own_http(snap.base_url, httpx.Timeout(120.0))  # the engine's socket (issue 40)

        def traffic() -> None:
            # requests until the test ends, a short and a long prompt in turn with a pause after each: decode, the
            # pool and KV move with every token, prompt tok/s and TTFT with every request, running with every pause
            # (one request alone left the last three to the idle canary, 30 s after it ended)
            n = 0
            while not done.is_set():
                n += 1
                try:
                    http.post(root + "/v1/completions", json={"model": snap.served_name, "prompt": PROMPT * (1 + 9 * (n % 2)),
                                                              "max_tokens": 160, "ignore_eos": True})
                except httpx.HTTPError:
                    return  # the engine is stopped under it at teardown
                done.wait(1.5)  # the traffic's shape (a sample or two with nothing running), not a synchronisation

        threading.Thread(target=traffic, daemon=True).start()
        # the header moves: VRAM follows the engine (card: ~93.8 GiB), decode and pool coverage appear
        page.wait_for_function(
            "() => { const v = document.querySelector('[data-testid=hdr-vram]');"
            " const c = document.querySelector('[data-testid=hdr-coverage]');"
            " const d = document.querySelector('[data-testid=hdr-decode]');"
            " return v && parseFloat(v.dataset.vramUsed) > 90 && c && c.dataset.coverage !== '—'"
            " && d && d.dataset.decode !== '—' }", timeout=40_000)
        assert "ready" in page.inner_text("[data-testid=hdr-engine]")
        assert float(hdr.get_attribute("data-vram-total")) == pytest.approx(96.0)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "telemetry-header.png"))

        page.get_by_role("tab", name="Telemetry").click()
        page.wait_for_function(
            "() => document.querySelector('#telemetry-details') &&"
            " document.querySelector('#telemetry-details').innerText.includes('slots filled')", timeout=30_000)
        # churn needs ≥ 2 s of summaries: poll (≤ 30 s) until every plot has drawn a line in the first colour.
        # A full-page shot: the page outgrows any fixed viewport (the last row was cut off under CI load),
        # so boxes (viewport coordinates) are shifted by the scroll offset into page coordinates.
        counts: dict = {}
        for _ in range(60):
            shot = page.screenshot(full_page=True)
            sx, sy = page.evaluate("() => [window.scrollX, window.scrollY]")
            boxes = {pid: page.locator(f"#telemetry-plot-{pid}").bounding_box() for pid in PLOT_IDS}
            counts = {pid: _blue_pixels(shot, {**box, "x": box["x"] + sx, "y": box["y"] + sy}) if box else 0
                      for pid, box in boxes.items()}
            if all(n > 30 for n in counts.values()):
                break
            page.wait_for_timeout(500)
        page.screenshot(path=str(ARTIFACTS / "telemetry-tab.png"), full_page=True)
        assert all(n > 30 for n in counts.values()), f"plots without a drawn series: {counts}"
        assert "SIMULATED" in page.inner_text("#telemetry-details")
    finally:
        done.set()
        engine.stop().wait(30)
