"""The newcomer's whole journey in headless Chromium (issue 7 §5–6).

Panel in demo mode, the simulated engine as a real Docker container, a local Hub-like server serving a
small real artifact (GNU tar --sparse | zstd | split):
open → Downloads (progress moves, completes) → Engine (preflight, start `quality`, boot phases, ready) →
header strip (VRAM, pool coverage) → Chat (thinking + answer, stats tagged quality) → switch to
`balanced` (ready again) → Chat (stats tagged balanced) → Self-test of `balanced` (result shown, Markdown
and JSON exported) → blind A/B balanced vs speed (run, graded, revealed, exported; listed after a reload)
→ reload: state, history and the engine remain. The data dir lives under a $HOME-like folder (neither the
system temp dir nor the working dir, where Gradio would serve any file: issue 29), and the test fails on
any traceback in the panel's log.
Accessibility and polish are checked in the same run. Screenshots go to test-artifacts/journey-*.png; the
four the README shows (docs/journey-*.png) are refreshed only with MOET_PANEL_DOCS_SCREENSHOTS=1 (conftest `snap`).
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.backend.download.manager import DownloadManager
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.config.settings import resolve_settings
from app.backend.state import AppState, build_app_state
from tests.conftest import BrowserSession, free_port, serving
from tests.download.conftest import artifact, start_hub  # noqa: F401  (session fixture reused)
from tests.journey.conftest import open_panel, tracebacks, user_data_dir
from tests.ui.a11y import horizontal_overflow, unlabelled_controls

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.docker]

TEST_LABELS = {"moet-panel.test": "1"}


def _recipe_on_port(tmp: Path, port: int) -> Path:
    """The simulated recipe, serving on a free port (the card's 8000 may be taken on a dev box), under its own id."""
    text = SIMULATED_RECIPE.read_text()
    # its own recipe id too: containers are named and cleaned up by recipe id, and other suites on this
    # box run the plain simulated recipe at the same time
    text = text.replace('id = "simulated"', f'id = "journey-{port}"', 1)
    text = text.replace("port = 8000", f"port = {port}").replace('"--port", "8000"', f'"--port", "{port}"')
    # its own recipe id: every demo panel and journey run on a shared box labels its engine recipe=simulated,
    # and adopts (or, tearing down, removes) the others' (the engine vanished mid-journey under load)
    text = text.replace('id = "simulated"', f'id = "journey-{port}"', 1)
    path = tmp / "simulated-journey.toml"
    path.write_text(text)
    return path


def _poll(fn: Any, what: str, timeout: float = 60.0, every_ms: int = 150, page: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        if page is not None:
            page.wait_for_timeout(every_ms)
        else:
            time.sleep(every_ms / 1000)  # polling interval with a deadline, not synchronisation
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def journey(tmp_path: Path, artifact: Any) -> Iterator[tuple[str, AppState]]:  # noqa: F811
    with user_data_dir() as data:
        yield from _journey(tmp_path, data, artifact)


def _journey(tmp_path: Path, data: Path, artifact: Any) -> Iterator[tuple[str, AppState]]:  # noqa: F811
    import docker

    client = docker.from_env()
    hub = start_hub(artifact, rate_cap_bps=400_000)  # a few seconds of visible progress
    settings = resolve_settings(_recipe_on_port(tmp_path, free_port()), data, demo=True,
                                demo_reason="no usable NVIDIA GPU (journey test)")
    settings.ensure_state_dir()
    state = build_app_state(settings)
    state.downloads.close()
    state.downloads = DownloadManager(settings, endpoint=hub.endpoint, connections=2, segment_size=256 * 1024)
    state.on_close(state.downloads.close)
    state.engine.options.extra_labels = dict(TEST_LABELS)
    # a 64K needle's prefill in about a second (the card's rate would take minutes on the SIMULATED engine)
    state.engine.options.extra_env = {"MOET_SIM_BOOT_S": "3", "MOET_SIM_PREFILL_TOK_S": "400000"}
    try:
        with serving(state) as panel:
            yield panel.url, state
    finally:
        hub.stop()
        for c in client.containers.list(all=True, filters={"label": "moet-panel.test=1"}):
            if c.labels.get("moet-panel.recipe") == settings.recipe.id:
                c.remove(force=True)


def _ask(page: Any, prompt: str, profile: str) -> str:
    page.get_by_role("tab", name="Chat").click()
    page.wait_for_function("() => document.querySelector('#chat-banner')?.innerText.includes('Engine ready')")
    before = page.locator("#chat-bot sub", has_text=re.compile(r"^profile ")).count()
    page.fill("#chat-input textarea", prompt)
    page.keyboard.press("Enter")
    page.locator("#chat-bot .thought-group").last.wait_for()  # the thinking block appears
    stats = page.locator("#chat-bot sub", has_text=re.compile(rf"^profile {profile} (?:· build \S+ )?· TTFT"))  # issue 45: the build
    _poll(lambda: stats.count() > 0 and page.locator("#chat-bot sub", has_text=re.compile(r"^profile ")).count() > before,
          f"the stats line tagged {profile}", timeout=90, page=page)
    return stats.last.inner_text()


def _download(page: Any, selector: str) -> tuple[str, str]:
    with page.expect_download() as dl:
        page.click(selector)
    return dl.value.suggested_filename, Path(dl.value.path()).read_text()


def _selftest_and_ab(page: Any, state: AppState, browser: BrowserSession) -> None:
    """The two features no other tool has, in the browser, on the user's own paths (issue 29 items 1-3)."""
    # Self-test of the serving profile (the tab defaults to it), short: 1 decode run, one 64K needle
    page.get_by_role("tab", name="Self-test").click()
    assert page.locator("#st-profile input").input_value() == "#2 quality / speed (balanced)"
    page.fill("#st-runs input", "1")
    page.fill("#st-tokens input", "64")
    page.fill("#st-needles textarea, #st-needles input", "64k")
    page.wait_for_function("() => document.querySelector('#st-status')?.innerText.includes('ready to run')")
    page.click("#st-run")
    page.wait_for_function("() => document.querySelector('#st-result')?.innerText.includes('64K')", timeout=180_000)
    assert "Self-test: profile balanced" in page.inner_text("#st-result")
    name, md = _download(page, "#st-export-md")
    assert name.startswith("selftest-balanced-") and md.startswith("# Self-test: profile balanced"), (name, md[:200])
    name, js = _download(page, "#st-export-json")
    assert name.endswith(".json") and json.loads(js)["profile_id"] == "balanced"
    browser.snap(page, "journey-09-selftest")

    # Blind A/B: balanced vs speed, one prompt, one seed; graded, revealed, exported
    page.get_by_role("tab", name="Compare").click()
    for box, pid in (("#ab-a", "balanced"), ("#ab-b", "speed")):
        page.locator(f"{box} input").click()
        page.get_by_role("option", name=pid, exact=True).locator("visible=true").click()
        page.keyboard.press("Escape")
        page.wait_for_function("([b, v]) => document.querySelector(b + ' input')?.value === v", arg=[box, pid])
        # the list closed before the next box opens its own (a late choices update can reopen a focused one)
        page.locator(f"{box} input").blur()
        page.wait_for_function("() => ![...document.querySelectorAll('[role=option]')].some(e => e.offsetParent !== null)")
    page.fill("#ab-prompts textarea", "Name one use of a ring buffer.")
    page.fill("#ab-seeds textarea, #ab-seeds input", "7")
    page.fill("#ab-max input", "64")
    page.dispatch_event("#ab-start", "click")
    page.wait_for_selector("#ab-pair-head[data-left='1']", timeout=240_000)
    rid = page.locator("#ab-run input").input_value()
    assert state.abtest is not None and rid in state.abtest.journal.runs()
    page.dispatch_event("#ab-pick-left", "click")
    page.wait_for_function("() => document.querySelector('#ab-pair-head')?.innerText.includes('All pairs graded')")
    page.dispatch_event("#ab-reveal-btn", "click")
    page.wait_for_function("() => document.querySelector('#ab-reveal')?.innerText.includes('speed')")
    assert "balanced" in page.inner_text("#ab-reveal")
    name, md = _download(page, "#ab-export")
    assert name == f"abtest-{rid}.md" and "speed" in md, (name, md[:200])
    browser.snap(page, "journey-10-abtest-reveal")
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors
    open_panel(page)  # the run is still listed after a reload (the reload's aborted requests are not app errors)
    browser.console_errors.clear()
    page.get_by_role("tab", name="Compare").click()
    assert page.locator("#ab-run input").input_value() == rid
    assert "1/1 pairs graded" in page.inner_text("#ab-status")


def test_newcomer_journey(journey: tuple[str, AppState], browser: BrowserSession,
                          capfd: pytest.CaptureFixture[str]) -> None:
    url, state = journey
    data = state.settings.data_dir
    assert not any(data.resolve().is_relative_to(p.resolve()) for p in (Path(tempfile.gettempdir()), Path.cwd()))
    page = browser.new_page(1280, 800)
    open_panel(page, url)
    page.wait_for_selector("#moet-header")
    assert "SIMULATED" in page.locator("#sim-banner").inner_text()
    assert "Why demo mode: no usable NVIDIA GPU" in page.locator("#sim-banner").inner_text()
    assert not unlabelled_controls(page), unlabelled_controls(page)
    browser.snap(page, "journey-01-open")

    # Downloads: start, see the progress bar move, complete, ckpt-id pin matches.
    page.get_by_role("tab", name="Downloads").click()
    page.locator("#dl-start").click()
    bar = page.locator('#dl-table [role="progressbar"]').first
    seen: set[int] = set()

    def progressed() -> bool:
        if bar.count():
            seen.add(int(bar.get_attribute("aria-valuenow") or 0))
        return 100 in seen and page.locator("#dl-table .st.done").count() == 1

    _poll(progressed, "the download to complete", timeout=90, every_ms=100, page=page)
    assert any(0 < v < 100 for v in seen), f"progress never moved between 0 and 100: {sorted(seen)}"
    page.wait_for_function("document.querySelector('#dl-ckpt').innerText.includes('match')")
    browser.snap(page, "journey-02-downloaded", docs="journey-downloaded")

    # Engine: preflight, start `quality`, watch boot phases, ready.
    page.get_by_role("tab", name="Engine").click()
    page.locator("#engine-preflight-run").click()
    page.wait_for_selector('#engine-preflight tr[data-item]')
    assert page.locator('#engine-preflight tr[data-status="fail"]').count() == 0, page.locator('#engine-preflight').inner_text()
    page.locator("#engine-start").click()
    phases: set[str] = set()

    def ready() -> bool:
        phases.add(page.locator("#engine-status").inner_text())
        return page.locator('[data-testid="engine-state"][data-state="ready"]').count() == 1

    _poll(ready, "the engine to become ready", timeout=120, every_ms=100, page=page)
    boot_text = "\n".join(phases)
    assert re.search(r"planes from cache|pool|KV|graph|API", boot_text, re.I), boot_text
    assert "quality" in page.locator("#engine-status").inner_text()
    # The header strip follows on the 1 s page timer: the screenshot shows both saying ready.
    page.locator('#moet-header [data-testid="hdr-engine"][data-state="ready"]').wait_for()
    browser.snap(page, "journey-03-engine-ready", docs="journey-engine")

    # Header strip: VRAM in use (simulated GPU follows the engine).
    header = page.locator("#moet-header")
    _poll(lambda: re.search(r"[1-9]\d*\.\d / 96\.0 GiB", header.inner_text()), "VRAM in the header", page=page)

    # Chat on `quality`, then the header shows pool coverage from the tick lines.
    line = _ask(page, "Explain what the FP4 recovery pool does, briefly.", "quality")
    assert re.search(r"profile quality · build pin · TTFT \d+\.\d\d s · \d+\.\d tok/s · \d+→\d+ tokens", line), line
    browser.snap(page, "journey-04-chat-quality")
    _poll(lambda: re.search(r"POOL COVERAGE\s*\d+\.\d%", header.inner_text(), re.I), "pool coverage", page=page)

    # Switch to `balanced` from the Engine tab; ready again; chat again.
    page.get_by_role("tab", name="Engine").click()
    page.locator("#engine-profile").get_by_text("#2 quality / speed", exact=False).click()
    page.locator("#engine-switch").click()
    # Wait on the badge itself: the busy line ("switch balanced in progress…") names the new profile while
    # the old engine is still READY.
    _poll(lambda: page.locator('[data-testid="engine-state"][data-state="ready"][data-profile="balanced"]').count() == 1,
          "the switch to balanced", timeout=120, page=page)
    assert state.engine.snapshot().profile_id == "balanced"
    line = _ask(page, "And what does PROMO_HYST=8 change?", "balanced")
    assert "profile balanced" in line
    browser.snap(page, "journey-05-chat-balanced", docs="journey-chat")

    # Telemetry tab renders live plots.
    page.get_by_role("tab", name="Telemetry").click()
    # The balanced engine's pool reached telemetry: its tick summary ("N/M slots filled") or, when its
    # SIMULATED answer broke off before the first tick (simengine/quality.py), its sizing line ("N slots").
    page.wait_for_function("() => /\\d+ slots/.test(document.querySelector('#telemetry-details')?.innerText || '')")
    _poll(lambda: page.locator("#telemetry-plot-vram canvas, #telemetry-plot-vram svg.marks").count() > 0,
          "the VRAM plot to draw", page=page)
    # the shortest window: the journey's few minutes fill more of the plots' one time range
    page.locator("#telemetry-window").get_by_text("5 min", exact=True).click()
    page.wait_for_function("() => Object.values(window.__moetPlots.ranges()).every(r => r[1] - r[0] < 301000)")
    browser.snap(page, "journey-06-telemetry", docs="journey-telemetry")

    # Reload: state, history and the running engine are all still there.
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors
    page.reload()  # aborts the page's in-flight requests: the browser logs those, they are not app errors
    page.wait_for_selector("#moet-header")
    browser.console_errors.clear()
    _poll(lambda: "balanced" in page.locator("#moet-header").inner_text().lower()
          or "quality / speed" in page.locator("#moet-header").inner_text(), "the header after reload", page=page)
    page.get_by_role("tab", name="Chat").click()
    _poll(lambda: page.locator("#chat-bot sub", has_text=re.compile(r"^profile balanced")).count() >= 1,
          "chat history after reload", page=page)
    page.get_by_role("tab", name="Downloads").click()
    _poll(lambda: page.locator("#dl-table .st.done").count() == 1, "downloads state after reload", page=page)
    browser.snap(page, "journey-07-after-reload")

    # Polish: no unlabelled controls, no horizontal overflow at 1280×800 and on a narrow window.
    assert not unlabelled_controls(page), unlabelled_controls(page)
    assert horizontal_overflow(page)["page"] <= 1, horizontal_overflow(page)
    narrow = browser.new_page(420, 800)
    narrow.goto(url)
    narrow.wait_for_selector("#moet-header")
    assert horizontal_overflow(narrow)["page"] <= 1, horizontal_overflow(narrow)
    browser.snap(narrow, "journey-08-narrow")
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors

    # last: the A/B leaves the engine on `speed`
    _selftest_and_ab(page, state, browser)
    assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors
    for p in browser.pages:
        p.context.close()  # the browser goes first, as a user closes the tab before stopping the panel
    browser.pages.clear()
    out, err = capfd.readouterr()
    assert not tracebacks(out + err), "\n\n".join(tracebacks(out + err))
