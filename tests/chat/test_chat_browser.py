"""Headless Chromium on the Chat tab, against the SIMULATED engine (fake controller snapshot)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.backend.chat.conversations import ChatService
from app.backend.config.settings import resolve_settings
from app.backend.simengine import api
from app.backend.state import AppState
from tests.chat.chat_helpers import FakeEngine, start_sim
from tests.polling import wait_for
from tests.conftest import ARTIFACTS, free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BOT = "#chat-bot"


def find_prompt(sim, natural: tuple[int, int], reasoning: tuple[int, int]) -> str:
    """A prompt whose simulated reply has the wanted length (the sim is deterministic per prompt)."""
    name = sim.config.served_name
    for i in range(2000):
        prompt = f"Explain the FP4 delta tier, take {i}."
        body = {"model": name, "messages": [{"role": "user", "content": prompt}], "temperature": 1.0,
                "top_p": 1.0, "min_p": 0.05, "max_tokens": 32768}
        req = api.parse_request("chat", body, name, sim.config.model, sim.config.max_model_len, "reasoning")
        plan, _ = api.token_source(req, sim.config.seed)
        if natural[0] <= plan.natural_tokens <= natural[1] and reasoning[0] <= plan.reasoning_tokens <= reasoning[1]:
            return prompt
    raise AssertionError("no prompt with that plan")


@pytest.fixture
def chat_panel(tmp_path: Path, monkeypatch) -> Iterator[tuple[str, FakeEngine, dict, AppState]]:
    import app.ui.app as ui_app

    # "fast" decodes at the card's profile-1 figure, so the docs screenshot shows a realistic stats line.
    sims = {"fast": start_sim(decode_tok_s=48.9), "slow": start_sim(decode_tok_s=25.0)}
    settings = resolve_settings(demo=True, data_dir=tmp_path / "data")
    state = AppState(settings=settings)
    engine = FakeEngine(sims["fast"], profile_id="quality")
    state.chat = ChatService(settings.recipe, settings.ensure_state_dir(), snapshot_fn=engine.snapshot)
    monkeypatch.setattr(ui_app, "TABS", ["app.ui.chat"])  # only the tab under test
    blocks = ui_app.build_ui(state)
    try:
        url = ui_app.launch(blocks, "127.0.0.1", free_port())  # as `serve` does: theme, the HTTP gate
        yield url, engine, sims, state
    finally:
        blocks.close()
        state.chat.close()
        for sim in sims.values():
            sim.stop()


def live_tokens(page) -> int:
    text = page.locator(BOT).inner_text()
    m = re.search(r"answering · (\d+) tokens", text)
    return int(m.group(1)) if m else -1


def test_chat_streams_thinking_answer_stats_and_stops(chat_panel, browser) -> None:
    url, engine, sims, state = chat_panel
    page = browser.new_page(1280, 900)
    page.goto(url)
    page.wait_for_selector("#chat-input textarea")
    page.wait_for_function("() => document.querySelector('#chat-banner')?.innerText.includes('Engine ready')")

    # 1. A finished answer: thinking collapsed with its duration, the answer, the stats line.
    page.fill("#chat-input textarea", find_prompt(sims["fast"], (130, 200), (45, 70)))
    page.keyboard.press("Enter")
    stats = page.locator(f"{BOT} sub", has_text=re.compile(r"^profile quality · TTFT"))
    stats.wait_for()
    line = stats.inner_text()
    assert re.search(r"profile quality · TTFT \d+\.\d\d s · \d+\.\d tok/s · \d+→\d+ tokens · \d+\.\d s · SIMULATED", line), line
    assert page.locator(f"{BOT} .thought-group").count() == 1
    assert page.locator(f"{BOT} .thought-group .title.expanded").count() == 0  # collapsed when done
    assert page.locator(f"{BOT} .thought-group .loading-spinner").count() == 0
    assert re.search(r"\(\d+(\.\d)?s\)", page.locator(f"{BOT} .thought-group .duration").inner_text())
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#tab-chat").screenshot(path=str(ARTIFACTS / "chat-answer.png"))  # docs/chat-answer.png

    # Sampling: the card's reason, the temperature-0 warning, snippets for this endpoint.
    page.get_by_text("Sampling and system prompt").click()
    page.locator("#chat-sampling", has_text="min_p=0.05").wait_for()  # the card's reason, once the accordion drew
    page.fill("#chat-temp input[type=number]", "0")
    page.locator("#chat-temp input[type=number]").press("Enter")
    page.wait_for_function("() => document.querySelector('#chat-temp-warning')?.innerText.includes('Never temperature=0')")
    page.fill("#chat-temp input[type=number]", "1")
    page.locator("#chat-temp input[type=number]").press("Enter")
    page.wait_for_function("() => !document.querySelector('#chat-temp-warning').innerText.includes('Never')")
    page.get_by_text("API snippets").click()
    page.wait_for_function(
        "url => document.querySelector('#chat-curl')?.innerText.includes(url + '/v1/chat/completions')",
        arg=sims["fast"].base_url)
    assert '"min_p": 0.05' in page.locator("#chat-curl").inner_text()
    # Export: a download link appears.
    page.click("#chat-export-json")
    page.wait_for_function("() => /\\.json/.test(document.querySelector('#chat-export-file')?.innerText || '')")
    assert page.locator("#chat-export-file a[href*='.json']").count() >= 1

    # 2. A long answer on a slower engine: thinking pending, then collapsed as the answer streams; Stop.
    engine.sim, engine.profile_id = sims["slow"], "balanced"
    page.click("#chat-new")
    page.wait_for_function("() => !document.querySelector('#chat-bot .thought-group')")
    page.fill("#chat-input textarea", find_prompt(sims["slow"], (380, 420), (50, 90)))
    page.keyboard.press("Enter")
    page.locator(f"{BOT} .thought-group .loading-spinner").wait_for()  # thinking: pending + spinner
    page.wait_for_function("() => /answering · \\d+ tokens/.test(document.querySelector('#chat-bot').innerText)")
    first = live_tokens(page)
    wait_for(lambda: live_tokens(page) > first + 5, what="the answer to keep streaming")
    assert page.locator(f"{BOT} .thought-group .title.expanded").count() == 0  # collapsed once answering
    page.screenshot(path=str(ARTIFACTS / "chat-streaming.png"))
    page.click("#chat-stop")
    page.locator(BOT, has_text="Stopped — this answer is incomplete.").wait_for()
    wait_for(lambda: sims["slow"].stats.aborted == 1, what="the engine to see the disconnect")
    assert sims["slow"].stats.completed == 0
    assert "profile balanced" in page.locator(f"{BOT} sub", has_text="partial answer kept").inner_text()
    page.screenshot(path=str(ARTIFACTS / "chat-stopped.png"))
    # The engine moved (another profile, another port): the banner and the snippets follow.
    page.wait_for_function("url => document.querySelector('#chat-curl')?.innerText.includes(url)",
                           arg=sims["slow"].base_url)
    assert "profile balanced" in page.locator("#chat-banner").inner_text()
    # Delete (confirmed): the conversation leaves the list, the older one is shown.
    page.on("dialog", lambda d: d.accept())
    page.click("#chat-delete")
    page.wait_for_function("() => document.querySelectorAll('#chat-convs label').length === 1")

    # 3. Through the panel's gateway (issue 50 item 3): behind an API key's answer, the reply waits its turn
    waiting_through_the_gateway(page, state.chat, engine, sims["slow"])
    assert not browser.console_errors, browser.console_errors


def waiting_through_the_gateway(page, chat: ChatService, engine: FakeEngine, sim) -> None:
    """The gateway on, one engine slot taken by a key's long answer: the page's reply says "waiting for the GPU
    (0 ahead)" (first in the fair queue), then Stop leaves the queue."""
    import threading

    import httpx

    from app.backend.gateway.proxy import Limits
    from app.backend.gateway.server import GatewayConfig
    from app.backend.gateway.switch import GatewayService

    svc = GatewayService(chat._state_dir, GatewayConfig(port=free_port(), limits=Limits(engine_slots=1)),
                         engine.snapshot, sim.base_url)
    stop = threading.Event()
    th: threading.Thread | None = None
    try:
        key = svc.create_key("greedy").key
        chat.take_turns_through(svc)
        assert svc.start().state.value == "on"
        route = svc.chat_route()
        assert route is not None

        def greedy() -> None:
            body = {"model": sim.config.served_name, "messages": [{"role": "user", "content": "long"}],
                    "max_tokens": 2000, "ignore_eos": True, "stream": True}  # 80 s at 25 tok/s
            with httpx.stream("POST", route.url + "/v1/chat/completions", json=body, timeout=60,
                              headers={"Authorization": f"Bearer {key}"}) as r:
                for _ in r.iter_bytes():
                    if stop.is_set():
                        return

        th = threading.Thread(target=greedy)
        th.start()
        wait_for(lambda: sim.engine.load()[0] >= 1, what="the key's answer at the engine")
        page.fill("#chat-input textarea", "my turn?")
        page.keyboard.press("Enter")
        page.locator(f"{BOT} sub", has_text="waiting for the GPU (0 ahead)").wait_for()
        page.click("#chat-stop")
        page.locator(BOT, has_text="Stopped — this answer is incomplete.").wait_for()
        # left the queue at once, not when the greedy answer ended (it was 16 s of 400 tokens; a loaded run waited
        # past 20 s): a Stop shuts the connection still waiting for its headers (CompletionStream.abort)
        assert th.is_alive() and sim.engine.load()[0] >= 1
    finally:
        stop.set()
        svc.close()  # its child ends: the key's stream ends with it
        if th is not None:
            th.join(30)


def test_chat_input_disabled_until_the_engine_is_ready(panel, browser) -> None:
    """The real app (build_app_state): the engine is not started, so the chat says why and where to go."""
    page = browser.new_page(1280, 800)
    page.goto(panel.url)
    page.get_by_role("tab", name="Chat").click()
    page.wait_for_function("() => document.querySelector('#chat-banner')?.innerText.includes('Chat is unavailable')")
    assert "Engine tab" in page.locator("#chat-banner").inner_text()
    assert page.locator("#chat-input textarea").is_disabled()
    assert page.locator("#chat-goto-engine").is_visible()
