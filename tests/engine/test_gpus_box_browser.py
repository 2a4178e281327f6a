"""A SIMULATED box of two GPUs from the page (issue 43), in headless Chromium on real Docker: the Engine tab starts
a profile on GPU 1 alone, the header shows every GPU's state and decode speed, the Self-test tab measures GPU 1
while GPU 0 keeps serving, the Compare tab runs A on GPU 0 and B on GPU 1 at once with no engine switch, a
candidate build serves on GPU 1 alone, and the Telemetry tab plots each GPU. Polls with deadlines; every container is removed on exit."""

from __future__ import annotations

from typing import Any

import pytest

from app.backend.contracts import EngineState
from app.backend.engine.builds.job import BuildService
from app.backend.jobs import JobState
from tests.conftest import serving
from tests.engine.conftest import sim_panel_state
from tests.polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.docker, pytest.mark.timeout(600)]


def _radio(page: Any, box: str, label: str) -> None:
    page.locator(f"#{box}").get_by_label(label, exact=True).check()


def test_a_two_gpu_box_from_the_page(docker_client, tmp_path, monkeypatch, browser) -> None:
    monkeypatch.setenv("MOET_PANEL_SIM_GPUS", "2")
    monkeypatch.setenv("MOET_PANEL_GPU", "simulated")
    with sim_panel_state(docker_client, tmp_path / "data") as state:
        box = state.box
        assert box is not None and box.gpus == [0, 1]
        for g in box.gpus:
            # a 1 s boot; a fast SIMULATED prefill: the self-test's TTFT prompts take no time (decode stays the card's)
            box.controller(g).options.extra_env = {"MOET_SIM_BOOT_S": "1", "MOET_SIM_PREFILL_TOK_S": "400000"}
        t = box.controller(0).start("quality")
        builder = BuildService(state.settings)  # the SIMULATED candidate `next`, offered by the Engine tab
        builder.start("next", None, "test")
        assert t.wait(120) and t.ok, t.message
        assert builder.wait(180).state is JobState.DONE, builder.progress().message
        with serving(state) as panel:
            page = browser.new_page(1280, 1200)
            page.set_default_timeout(60_000)
            page.goto(panel.url)
            # the Engine tab: "Apply to" GPU 1, balanced, Start: only GPU 1's engine boots
            page.get_by_role("tab", name="Engine").click()
            _radio(page, "engine-scope", "GPU 1")
            _radio(page, "engine-profile", next(label for label in _labels(page, "engine-profile")
                                                 if label.startswith("#2") or "balanced" in label.lower()))
            page.click("#engine-start")
            page.wait_for_selector('#engine-action:has-text("GPU 1:")')
            page.wait_for_selector('#engine-gpus tr[data-gpu="1"][data-state="ready"][data-profile="balanced"]',
                                   timeout=120_000)
            assert box.controller(0).snapshot().profile_id == "quality"  # GPU 0 untouched
            # the header: both GPUs ready, each with its own profile
            page.wait_for_selector('[data-testid="hdr-gpu"][data-gpu="1"][data-state="ready"]')
            hdr = page.inner_text('[data-testid="hdr-gpus"]')
            assert "GPU 0" in hdr and "quality" in hdr and "GPU 1" in hdr and "balanced" in hdr
            browser.snap(page, "gpus-engine-tab")

            # the Self-test tab: measure GPU 1 (balanced) while GPU 0 serves quality
            page.get_by_role("tab", name="Self-test").click()
            _radio(page, "st-gpu", "GPU 1")  # the profile follows what GPU 1 serves
            page.wait_for_function("() => document.querySelector('#st-profile input')?.value.includes('balanced')")
            page.get_by_role("tab", name="Profiles").click()  # and so does the tab opened again
            page.get_by_role("tab", name="Self-test").click()
            page.wait_for_function("() => document.querySelector('#st-profile input')?.value.includes('balanced')")
            page.fill("#st-tokens input", "60")
            page.fill("#st-runs input", "1")
            page.fill("#st-needles textarea, #st-needles input", "")
            page.wait_for_function("() => document.querySelector('#st-status')?.innerText.includes('on GPU 1')")
            page.wait_for_function("() => document.querySelector('#st-run')?.disabled === false")
            page.click("#st-run")
            wait_for(lambda: 1 in box.left_out() or state.selftest.progress().state is JobState.DONE, 60,
                     "GPU 1 left out of the gateway while it measures")
            page.wait_for_function("() => document.querySelector('#st-result')?.innerText.includes('GPU: 1')",
                                   timeout=120_000)
            r = state.selftest.store.latest("balanced")
            assert r is not None and r.gpu == 1
            assert box.left_out() == set()  # back in the gateway

            # the Compare tab: A (quality) on GPU 0 and B (balanced) on GPU 1, at once, no switch
            page.get_by_role("tab", name="Compare").click()
            page.locator("#ab-a input").fill("quality")
            page.keyboard.press("Enter")
            page.locator("#ab-b input").fill("balanced")
            page.keyboard.press("Enter")
            # by default GPU 0 keeps serving (both sides on GPU 1); both GPUs must be asked for (issue 49)
            assert page.locator("#ab-gpu-a input").input_value() == "GPU 1"
            assert page.locator("#ab-gpu-b input").input_value() == "GPU 1"
            assert page.locator('#ab-gpu-note[data-every="0"]').count() == 1
            page.locator("#ab-gpu-a input").fill("GPU 0")
            page.keyboard.press("Enter")
            page.locator('#ab-gpu-note[data-every="1"]').wait_for()
            page.fill("#ab-prompts textarea", "Name a prime.")
            page.fill("#ab-seeds textarea, #ab-seeds input", "1")
            page.fill("#ab-max input", "40")
            containers = {g: box.controller(g).snapshot().container_id for g in box.gpus}
            page.click("#ab-start")
            page.wait_for_selector('#ab-progress[data-state="invalid"]:has-text("leave no GPU of this box serving")')
            page.check("#ab-every-gpu input")
            page.click("#ab-start")
            wait_for(lambda: state.abtest.progress().state is JobState.DONE, 120, "the A/B run done")
            assert {g: box.controller(g).snapshot().container_id for g in box.gpus} == containers  # no switch
            assert all(box.controller(g).snapshot().state is EngineState.READY for g in box.gpus)
            page.wait_for_selector("#ab-left textarea")

            # the Engine tab's builds: the candidate serves on GPU 1 alone ("Apply to" GPU 1), GPU 0 keeps the pin
            page.get_by_role("tab", name="Engine").click()
            _radio(page, "engine-scope", "GPU 1")
            page.get_by_text("Engine builds — upgrade with evidence").click()
            assert page.locator("#engine-candidate input").input_value() == "next"
            page.click("#engine-serve-candidate")
            page.wait_for_selector('#engine-builds-action:has-text("GPU 1:")')
            wait_for(lambda: (s := box.controller(1).snapshot()).is_ready and s.build == "next", 120,
                     "GPU 1 serving the candidate")
            assert box.controller(0).snapshot().build == "pin" and box.controller(0).snapshot().is_ready
            page.wait_for_selector('#engine-gpus tr[data-gpu="1"]:has-text("build next")')

            # the Telemetry tab: a line per GPU
            page.get_by_role("tab", name="Telemetry").click()
            page.wait_for_selector("#telemetry-plot-gpus_vram canvas")
            page.wait_for_selector("#telemetry-plot-gpus_decode")
            assert "GPU 0" in page.inner_text("#telemetry-plots") and "GPU 1" in page.inner_text("#telemetry-plots")
            browser.snap(page, "gpus-telemetry")
            assert not [e for e in browser.console_errors if "favicon" not in e], browser.console_errors


def _labels(page: Any, box: str) -> list[str]:
    return [x.strip() for x in page.locator(f"#{box} label").all_inner_texts()]
