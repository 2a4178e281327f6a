"""Self-test and A/B results reach the browser when the data dir is under the user's home (issue 29
items 1-3, issue 30 item 3/4), in headless Chromium; no Docker: the results are stored as a finished run
leaves them. Fails on any traceback in the panel's log (stderr, where Gradio prints them)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from app.backend.abtest.journal import Generation, Journal, new_spec
from app.backend.selftest.store import ResultsStore
from app.backend.selftest.types import DecodeRun, NeedleOutcome, SelfTestResult
from tests.conftest import BrowserSession, close_panel, launch_panel
from tests.journey.conftest import own_mode, tracebacks, user_data_dir

pytestmark = [pytest.mark.browser]


def _stored_result(state_dir: Path) -> SelfTestResult:
    r = SelfTestResult(profile_id="balanced", image_id="sha256:" + "1" * 64, recipe_hash="h", date="2026-12-03T10:00:00+00:00",
                       simulated=True, card_decode_tok_s=60.0, plan={"runs": 2}, wall_s=12.0,
                       decode=[DecodeRun(59.5, 100, 0.1, 59.0), DecodeRun(60.5, 100, 0.1, 60.0)],
                       needles=[NeedleOutcome(65536, 0.5, 65000, "K-1234", True, "K-1234")])
    ResultsStore(state_dir).save(r)
    return r


def _generated_run(state_dir: Path) -> str:
    j = Journal(state_dir)
    spec = new_spec("quality", "balanced", ["Write a haiku about GPUs."], [1, 2], 64)
    j.create(spec)
    for pid, seed in spec.cells:
        for side in ("A", "B"):
            j.append(spec.run_id, Generation(side, pid, seed, f"answer {side} {seed}", 5, 50.0, 0.2, "stop"))
    return spec.run_id


def _download(page: Any, selector: str, served_from: Path) -> tuple[str, str]:
    """Click an export button; the file's name and text. It must come from the panel's own web cache."""
    with page.expect_download() as dl:
        page.click(selector)
    assert str(served_from) in unquote(dl.value.url), dl.value.url
    return dl.value.suggested_filename, Path(dl.value.path()).read_text()


def test_selftest_and_ab_results_reach_the_browser_from_a_home_data_dir(browser: BrowserSession,
                                                                         capfd: pytest.CaptureFixture[str]) -> None:
    gradio_tmp = Path(tempfile.gettempdir()) / "gradio"
    before = set(gradio_tmp.rglob("*")) if gradio_tmp.exists() else set()
    with user_data_dir() as data:
        panel = launch_panel(data)
        state_dir = panel.state.settings.state_dir
        web_tmp = state_dir / f"gradio-{os.getpid()}"
        try:
            assert own_mode(web_tmp) == 0o700 and own_mode(state_dir / "exports") == 0o700
            _stored_result(state_dir)
            run_id = _generated_run(state_dir)
            page = browser.new_page(1280, 1000)
            page.goto(panel.url)

            # Self-test: the stored result, shown and exported (Markdown and JSON)
            page.get_by_role("tab", name="Self-test").click()
            page.locator("#st-profile input").click()
            page.get_by_role("option", name="#2 quality / speed (balanced)", exact=True).click()
            page.wait_for_function("() => document.querySelector('#st-result')?.innerText.includes('balanced')"
                                   " && !document.querySelector('#st-result').innerText.includes('No self-test')")
            name, md = _download(page, "#st-export-md", web_tmp)
            assert name.startswith("selftest-balanced-") and name.endswith(".md") and "balanced" in md, (name, md[:200])
            name, js = _download(page, "#st-export-json", web_tmp)
            assert name.endswith(".json") and json.loads(js)["profile_id"] == "balanced"

            # Compare: the run is listed, graded, revealed, exported
            page.get_by_role("tab", name="Compare").click()
            page.wait_for_function("id => document.querySelector('#ab-run input')?.value === id", arg=run_id)
            for _ in range(2):
                head = page.locator("#ab-pair-head").inner_text()
                page.click("#ab-pick-left")
                page.wait_for_function("h => document.querySelector('#ab-pair-head')?.innerText !== h", arg=head)
            page.wait_for_function("() => document.querySelector('#ab-pair-head')?.innerText.includes('All pairs graded')")
            page.click("#ab-reveal-btn")
            page.wait_for_function("() => /quality/.test(document.querySelector('#ab-reveal')?.innerText || '')")
            name, md = _download(page, "#ab-export", web_tmp)
            assert name == f"abtest-{run_id}.md" and "quality" in md and "balanced" in md, (name, md[:300])

            # A reload lists the runs again (issue 29 item 3)
            page.reload()
            page.get_by_role("tab", name="Compare").click()
            page.wait_for_function("id => document.querySelector('#ab-run input')?.value === id", arg=run_id)
            # a run made after the page was built (another tab, the CLI) is listed after a reload too
            newer = _generated_run(state_dir)
            page.reload()
            page.get_by_role("tab", name="Compare").click()
            page.locator("#ab-run input").click()
            page.get_by_role("option", name=newer, exact=True).wait_for()
            page.context.close()  # the browser goes first, as a user closes the tab before stopping the panel
        finally:
            close_panel(panel)
        assert not web_tmp.exists(), "the panel's web cache folder outlived the panel"
    after = set(gradio_tmp.rglob("*")) if gradio_tmp.exists() else set()
    leaked = [p for p in after - before if re.search(r"(selftest|abtest)-", p.name)]
    assert not leaked, f"exports copied into the shared {gradio_tmp}: {leaked}"
    out, err = capfd.readouterr()
    assert not tracebacks(out + err), "\n\n".join(tracebacks(out + err))
