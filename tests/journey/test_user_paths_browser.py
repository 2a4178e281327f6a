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
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.config.settings import resolve_settings
from app.backend.state import build_app_state
from tests.conftest import BrowserSession, close_panel, launch_panel, launch_state
from tests.journey.conftest import open_panel, own_mode, tracebacks, user_data_dir

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


def _save_custom(settings: Any) -> str:
    import dataclasses

    import app.backend.profiles.custom as cp

    recipe = settings.recipe
    base = recipe.profile("balanced")
    form = dataclasses.replace(cp.form_from_profile(recipe, base), promo_hyst="4")
    profile = cp.profile_from_form(recipe, base, "hyst four", form, set())
    cp.save_custom_profile(settings, profile)
    return profile.id


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
        settings = resolve_settings(SIMULATED_RECIPE, data, demo=True, demo_reason="no usable NVIDIA GPU (test)")
        settings.ensure_state_dir()
        panel = launch_state(build_app_state(settings))
        state_dir = panel.state.settings.state_dir
        web_tmp = state_dir / f"gradio-{os.getpid()}"
        try:
            assert own_mode(web_tmp) == 0o700 and own_mode(state_dir / "exports") == 0o700
            _stored_result(state_dir)
            run_id = _generated_run(state_dir)
            page = browser.new_page(1280, 1000)
            open_panel(page, panel.url)

            # the demo banner's every line readable in dark mode too: its own dark text on its own light yellow
            dark = browser.new_page(1280, 600)
            open_panel(dark, panel.url + "/?__theme=dark")
            assert dark.evaluate("document.body.classList.contains('dark')")
            colours = dark.evaluate("[...document.querySelectorAll('#sim-banner .moet-sim-banner, #sim-banner small')]"
                                    ".map(e => getComputedStyle(e).color)")
            assert len(colours) == 2 and set(colours) == {"rgb(92, 68, 0)"}, colours  # the "Why demo mode" line too
            dark.context.close()

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
            open_panel(page)
            page.get_by_role("tab", name="Compare").click()
            page.wait_for_function("id => document.querySelector('#ab-run input')?.value === id", arg=run_id)
            # a run made after the page was built (another tab, the CLI) is listed after a reload too
            newer = _generated_run(state_dir)
            open_panel(page)
            page.get_by_role("tab", name="Compare").click()
            page.locator("#ab-run input").click()
            page.get_by_role("option", name=newer, exact=True).wait_for()
            page.keyboard.press("Escape")

            # A custom profile saved after the page was built (here as another panel or the CLI would):
            # selectable on Engine, Self-test and Compare without a restart or a reload (issue 29 item 4)
            custom = _save_custom(panel.state.settings)
            page.get_by_role("tab", name="Engine").click()
            page.locator("#engine-profile").get_by_text("hyst four (custom: hyst-four)").wait_for()
            page.get_by_role("tab", name="Self-test").click()
            page.locator("#st-profile input").click()
            page.get_by_role("option", name="hyst four (custom: hyst-four)", exact=True).click()
            page.wait_for_function("() => document.querySelector('#st-result')?.innerText.includes('hyst-four')")
            page.get_by_role("tab", name="Compare").click()
            page.locator("#ab-b input").click()
            page.get_by_role("option", name=custom, exact=True).click()
            assert panel.state.profiles.label(custom) == "hyst four (custom: hyst-four)"  # the header's name
            page.context.close()  # the browser goes first, as a user closes the tab before stopping the panel
        finally:
            close_panel(panel)
        assert not web_tmp.exists(), "the panel's web cache folder outlived the panel"
    after = set(gradio_tmp.rglob("*")) if gradio_tmp.exists() else set()
    leaked = [p for p in after - before if re.search(r"(selftest|abtest)-", p.name)]
    assert not leaked, f"exports copied into the shared {gradio_tmp}: {leaked}"
    out, err = capfd.readouterr()
    assert not tracebacks(out + err), "\n\n".join(tracebacks(out + err))


def test_a_second_panel_serves_none_of_the_first_ones_files(browser: BrowserSession,
                                                            capfd: pytest.CaptureFixture[str]) -> None:
    """Panel A (this process) hands out an export; panel B (`moet-panel serve --demo`, its own process and
    data dir under the same fake home) must not serve it, nor A's exports folder; B's web cache folder is
    private while it runs and gone after it stops (issue 30 item 3/4)."""
    import httpx

    from tests.conftest import free_port, serve_demo_process

    with user_data_dir() as data:
        panel = launch_panel(data)
        state_dir = panel.state.settings.state_dir
        log_path = data.parent / "panel-b.log"
        proc = None
        try:
            _stored_result(state_dir)
            page = browser.new_page(1280, 1000)
            open_panel(page, panel.url)
            page.get_by_role("tab", name="Self-test").click()
            page.locator("#st-profile input").click()
            page.get_by_role("option", name="#2 quality / speed (balanced)", exact=True).click()
            page.wait_for_function("() => !document.querySelector('#st-result')?.innerText.includes('No self-test')")
            with page.expect_download() as dl:
                page.click("#st-export-md")
            url = dl.value.url
            served = unquote(url.split("file=", 1)[1])
            assert served.startswith(str(state_dir / f"gradio-{os.getpid()}")), served
            page.context.close()

            port = free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith(("MOET_PANEL_", "GRADIO_"))}
            env["XDG_DATA_HOME"] = str(data.parent / "share")  # B's demo data dir: a sibling of A's
            with serve_demo_process(port, log_path, env, 120) as proc:
                b_state = data.parent / "share" / "moet-panel" / "demo" / ".moet-panel"
                b_tmp = b_state / f"gradio-{proc.pid}"
                assert own_mode(b_tmp) == 0o700
                export = next((state_dir / "exports").glob("selftest-*.md"))
                with httpx.Client(timeout=15) as c:
                    assert c.get(url).status_code == 200  # A serves its own file
                    for path in (served, str(export)):
                        r = c.get(f"http://127.0.0.1:{port}/gradio_api/file={path}")
                        assert r.status_code in (403, 404), (path, r.status_code)
        finally:
            close_panel(panel)
        b_log = log_path.read_text()
        assert proc is not None and proc.returncode == 0, b_log[-2000:]
        assert not b_tmp.exists(), "panel B's web cache folder outlived it"
        assert not tracebacks(b_log), "\n\n".join(tracebacks(b_log))
    out, err = capfd.readouterr()
    assert not tracebacks(out + err), "\n\n".join(tracebacks(out + err))
