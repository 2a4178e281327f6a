"""Issue 49, a new user's walk (demo panel of two SIMULATED GPUs, headless Chromium, data dir under $HOME), checked
by geometry: the chat's message box is on screen without scrolling at 1280 x 800 and 390 x 844; an export's file
name is one line; Edit has a cancel; a blind A/B on every GPU warns on screen and is asked for, by default one
GPU keeps serving. No engine is started (the walk's items here are the page's)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.backend.chat import export
from app.backend.chat.models import Conversation, Message

from tests.conftest import Panel, close_panel, launch_panel
from tests.journey.conftest import open_panel, user_data_dir

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SIZES = [(1280, 800), (390, 844)]
ON_SCREEN = ("s => { const r = document.querySelector(s).getBoundingClientRect();"
             " return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, h: innerHeight, w: innerWidth,"
             " scrolled: scrollY}; }")


@pytest.fixture(scope="module")
def two_gpu_panel() -> Iterator[Panel]:
    with pytest.MonkeyPatch.context() as mp, user_data_dir() as data:
        mp.setenv("MOET_PANEL_SIM_GPUS", "2")
        mp.setenv("MOET_PANEL_GPU", "simulated")
        p = launch_panel(data)
        try:
            assert p.state.box is not None and p.state.box.gpus == [0, 1]
            yield p
        finally:
            close_panel(p)


def _chat(page, panel: Panel) -> None:
    open_panel(page, panel.url)
    page.get_by_role("tab", name="Chat").click()
    page.locator("#chat-input textarea").wait_for()
    page.wait_for_function("() => document.querySelector('#chat-banner')?.innerText.trim().length > 0")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_the_message_box_is_on_screen_without_scrolling(two_gpu_panel, browser, size) -> None:
    page = browser.new_page(*size)
    _chat(page, two_gpu_panel)
    box = page.evaluate(ON_SCREEN, "#chat-input textarea")
    assert box["scrolled"] == 0 and 0 <= box["top"] and box["bottom"] <= box["h"], box
    assert box["right"] <= box["w"], box
    browser.snap(page, f"walk-chat-{size[0]}", full_page=False)


LINES = ("() => { const f = document.querySelector('#chat-export-file td.filename'), s = f.querySelector('.stem');"
         " const e = f.querySelector('.ext'), r = [...s.getClientRects()];"
         " return {lines: r.map(x => Math.round(x.width)), row: f.getBoundingClientRect().width,"
         " same: Math.abs(r[r.length - 1].top - e.getBoundingClientRect().top) < 2}; }")


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_an_export_file_name_is_one_line(two_gpu_panel, browser, size) -> None:
    """A new chat's export name is one line, its extension beside it (issue 49: one letter per line, "E. .json");
    a name longer than the row wraps at its hyphens, each line but the last using most of the row."""
    chat = two_gpu_panel.state.chat
    conv = chat.new_conversation()
    page = browser.new_page(*size)
    _chat(page, two_gpu_panel)
    page.locator("#chat-convs label").nth(0).click()  # the newest: the one just made
    page.click("#chat-export-json")
    stem = page.locator("#chat-export-file .stem").first
    stem.wait_for()
    assert stem.inner_text() == f"New-chat-{conv.id[:8]}"
    got = page.evaluate(LINES)
    assert len(got["lines"]) == 1 and got["same"], got
    browser.snap(page, f"walk-export-{size[0]}", full_page=False, clip_to="#chat-export-file")

    long = chat.new_conversation(title="Explain the FP4 delta tier and how the pool promotes experts under load")
    page.reload()
    _chat(page, two_gpu_panel)
    page.locator("#chat-convs label", has_text="Explain the FP4").first.click()
    page.click("#chat-export-json")
    page.locator("#chat-export-file .stem", has_text=long.id[:8]).wait_for()
    got = page.evaluate(LINES)
    assert all(w >= 0.5 * got["row"] for w in got["lines"][:-1]), got


def test_edit_has_a_cancel(two_gpu_panel, browser) -> None:
    chat = two_gpu_panel.state.chat
    conv = chat.import_json(export.to_json(Conversation(title="Walk edit", messages=[
        Message("user", "What is a B-tree?"), Message("assistant", "A balanced search tree.")])))
    page = browser.new_page(1280, 800)
    _chat(page, two_gpu_panel)
    page.locator("#chat-convs label", has_text="Walk edit").first.click()
    page.wait_for_function("() => document.querySelector('#chat-bot')?.innerText.includes('balanced search tree')")
    edit = page.locator("#chat-edit")
    assert edit.inner_text().strip() == "Edit last message"
    edit.click()
    page.wait_for_function("() => document.querySelector('#chat-input textarea').value === 'What is a B-tree?'")
    page.wait_for_function("() => document.querySelector('#chat-edit').innerText.trim() === 'Cancel edit'")
    assert "Cancel edit" in page.inner_text("#chat-edit-hint")
    edit.click()
    page.wait_for_function("() => document.querySelector('#chat-edit').innerText.trim() === 'Edit last message'")
    assert page.locator("#chat-input textarea").input_value() == ""
    assert page.inner_text("#chat-edit-hint").strip() == ""
    assert [m.content for m in chat.get(conv.id).messages] == ["What is a B-tree?", "A balanced search tree."]


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_an_ab_on_every_gpu_warns_on_screen_and_is_asked_for(two_gpu_panel, browser, size) -> None:
    page = browser.new_page(*size)
    open_panel(page, two_gpu_panel.url)
    page.get_by_role("tab", name="Compare").click()
    # by default both sides take turns on GPU 1: GPU 0 (which Chat talks to) keeps serving
    assert page.locator("#ab-gpu-a input").input_value() == "GPU 1"
    assert page.locator("#ab-gpu-b input").input_value() == "GPU 1"
    assert page.locator('#ab-gpu-note[data-every="0"]').count() == 1
    page.locator("#ab-gpu-a input").fill("GPU 0")
    page.keyboard.press("Enter")
    note = page.locator('#ab-gpu-note[data-every="1"]')
    note.wait_for()
    note.scroll_into_view_if_needed()
    box = page.evaluate(ON_SCREEN, "#ab-gpu-note")
    assert box["left"] >= 0 and box["right"] <= box["w"] and box["bottom"] - box["top"] > 10, box
    assert "leave no GPU of this box serving" in note.inner_text()
    page.fill("#ab-prompts textarea", "Name a prime.")
    page.fill("#ab-seeds textarea, #ab-seeds input", "1")
    page.click("#ab-start")
    page.wait_for_selector('#ab-progress[data-state="invalid"]:has-text("Take every GPU out of service")')
    assert two_gpu_panel.state.abtest.journal.runs() == []  # nothing started, nothing journalled
    browser.snap(page, f"walk-ab-every-gpu-{size[0]}", full_page=False)


def test_a_drain_grace_out_of_range_is_a_clear_message_not_a_traceback(two_gpu_panel, browser, capfd) -> None:
    """Issue 49: 99999 showed Gradio's toast and printed ~30 lines of traceback in the panel's output."""
    page = browser.new_page(1280, 800)
    open_panel(page, two_gpu_panel.url)
    page.get_by_role("tab", name="Service").click()
    capfd.readouterr()
    page.fill("#service-drain-grace input", "99999")
    page.click("#service-save-grace")
    page.locator("#service-note", has_text="not saved: 99999 s").wait_for()
    assert "0 to 3600 seconds" in page.inner_text("#service-note")
    assert page.locator(".toast-body").count() == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err and "greater than maximum" not in err, err


def test_promote_is_not_the_main_action_without_a_candidate(two_gpu_panel, browser) -> None:
    page = browser.new_page(1280, 800)
    open_panel(page, two_gpu_panel.url)
    page.get_by_role("tab", name="Engine").click()
    page.get_by_text("Engine builds — upgrade with evidence").click()
    promote = page.locator("#engine-promote")
    promote.wait_for()
    assert promote.is_disabled() and "primary" not in (promote.get_attribute("class") or "")
    assert page.locator("#engine-serve-candidate").is_disabled()
