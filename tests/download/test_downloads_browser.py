"""The Downloads tab doing a live download from the SIMULATED hub, in headless Chromium."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.backend.contracts import size_pair_text
from app.backend.download.manager import DownloadManager
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.config.settings import resolve_settings
from app.backend.state import build_app_state

from ..conftest import ARTIFACTS, serving
from .conftest import start_hub

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_downloads_tab_live_download(browser, artifact, tmp_path):
    hub = start_hub(artifact, rate_cap_bps=250_000)  # ~3 MiB over 2 capped connections: a few seconds
    settings = resolve_settings(SIMULATED_RECIPE, tmp_path / "data", demo=True)
    settings.ensure_state_dir()
    state = build_app_state(settings)
    state.downloads.close()
    state.downloads = DownloadManager(settings, endpoint=hub.endpoint, connections=2, segment_size=256 * 1024)
    state.on_close(state.downloads.close)
    try:
        # the panel as `moet-panel serve` launches it (its page feed included); closes the state after
        with serving(state) as panel:
            url = panel.url
            page = browser.new_page(1280, 900)
            page.goto(url)
            page.get_by_role("tab", name="Downloads").click()
            page.wait_for_selector("#dl-start")
            total = sum(p.stat().st_size for p in artifact.parts)
            listed = size_pair_text(0, total).split(" / ", 1)[1]  # the total in its own unit (issue 49: not 0.014 GiB)
            page.wait_for_function(f"document.querySelector('#dl-table').innerText.includes({listed!r})")  # before Start
            page.locator("#dl-start").click()
            bar = page.locator('#dl-table [role="progressbar"]').first
            deadline = time.monotonic() + 30
            seen_mid = False
            while time.monotonic() < deadline:
                now = int(bar.get_attribute("aria-valuenow") or 0) if bar.count() else 0
                if 0 < now < 100 and not seen_mid:
                    seen_mid = True
                    assert page.locator("#dl-table").get_by_text("SIMULATED").count() >= 1
                    ARTIFACTS.mkdir(exist_ok=True)
                    page.screenshot(path=str(ARTIFACTS / "downloads-tab-running.png"), full_page=True)
                if now == 100 and page.locator("#dl-table .st.done").count():
                    break
                page.wait_for_timeout(150)
            assert seen_mid, "never saw the bar between 0 and 100%"
            assert page.locator("#dl-table .st.done").count() == 1, page.locator("#dl-table").inner_text()
            page.wait_for_function("document.querySelector('#dl-ckpt').innerText.includes('match')")
            page.screenshot(path=str(ARTIFACTS / "downloads-tab-done.png"), full_page=True)
            assert "match" in page.locator("#dl-ckpt").inner_text()
            assert "files" in page.locator("#dl-table").inner_text()
            assert (Path(settings.data_dir) / "planescache").is_dir()
    finally:
        hub.stop()
