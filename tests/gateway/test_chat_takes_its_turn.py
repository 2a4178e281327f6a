"""The Chat tab takes its turn like everyone (issue 50 item 3; docs/chat.md "Taking turns"): while the panel's
gateway serves, a chat reply goes through its admission and fair queue under the panel's own key, so beside four
greedy API keys it waits at most one answer, shows its place ("n ahead") while it waits, and its tokens are in the
usage and the panel's /metrics. Real gateway process, the SIMULATED engine (one sequence, as the card), the openai
SDK for the greedy keys; everything stopped at teardown."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest

from app.backend.chat.client import SamplingParams
from app.backend.chat.conversations import ChatService
from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.gateway.gwmetrics import families
from app.backend.contracts import CHAT_MAX_TOKENS
from app.backend.gateway.keys import PANEL_CHAT_KEY, KeyStoreError
from app.backend.gateway.proxy import DEFAULT_MAX_TOKENS
from app.backend.gateway.proxy import Limits
from app.backend.gateway.server import GatewayConfig
from app.backend.gateway.switch import GatewayService
from app.backend.recipe import SIMULATED_RECIPE, load_recipe
from app.backend.simengine import SimEngineServer
from tests.conftest import free_port
from tests.gateway.conftest import SERVED
from tests.gateway.test_gateway_process import FakeEngine
from tests.polling import wait_for

TOKENS = 40  # one answer: 0.4 s at the test engine's 100 tok/s


@pytest.fixture
def panel(home_data: Path, make_sim: Callable[..., SimEngineServer]) -> Iterator[tuple[GatewayService, ChatService]]:
    sim = make_sim(max_num_seqs=1, decode_tok_s=100.0, reasoning_mode="none")
    engine = FakeEngine(EngineSnapshot(state=EngineState.READY, base_url=sim.base_url, served_name=SERVED,
                                       profile_id="quality"))
    state = home_data / ".moet-panel"
    svc = GatewayService(state, GatewayConfig(port=free_port(), limits=Limits(engine_slots=1, rate_per_min=100000.0)),
                         engine.snapshot, sim.base_url, subscribe=engine.on_change)
    chat = ChatService(load_recipe(SIMULATED_RECIPE), state, snapshot_fn=engine.snapshot,
                       extra_body={"ignore_eos": True})
    chat.take_turns_through(svc)
    try:
        yield svc, chat
    finally:
        chat.close()
        svc.close()


def test_a_chat_waits_at_most_one_answer_behind_four_greedy_keys_and_is_billed(panel) -> None:
    svc, chat = panel
    with pytest.raises(KeyStoreError, match="the panel's own"):  # nobody else may take the chat's key's name
        svc.create_key(PANEL_CHAT_KEY)
    greedy = {f"greedy{i}": svc.create_key(f"greedy{i}").key for i in range(4)}
    assert svc.start().state.value == "on"
    route = svc.chat_route()
    assert route is not None and route.url.startswith("http://127.0.0.1:")
    chat_key = next(k for k in svc.list_keys() if k.name == PANEL_CHAT_KEY and k.status == "active")
    # the Chat tab's own cap, above the gateway's shared default (a chat asks for up to CHAT_MAX_TOKENS)
    assert chat_key.max_tokens == CHAT_MAX_TOKENS > DEFAULT_MAX_TOKENS
    url = route.url + "/v1"

    # one answer alone, as the greedy keys ask it (the measure of "one answer")
    with openai.OpenAI(base_url=url, api_key=greedy["greedy0"], max_retries=0, timeout=60) as c:
        t = time.monotonic()
        c.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "hi"}], max_tokens=TOKENS,
                                  extra_body={"ignore_eos": True})
        one = time.monotonic() - t

    stop = threading.Event()
    errors: list[str] = []
    ended: list[float] = []  # when each greedy answer ended, Unix time (the engine runs one at a time)

    def greedy_loop(key: str) -> None:  # three requests at once, always: the queue never empties of them
        def worker() -> None:
            with openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=120) as c:
                while not stop.is_set():
                    try:
                        c.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "more"}],
                                                  max_tokens=TOKENS, extra_body={"ignore_eos": True})
                        ended.append(time.time())
                    except openai.OpenAIError as exc:
                        errors.append(f"{key[:8]}: {exc}")

        ws = [threading.Thread(target=worker) for _ in range(3)]
        for w in ws:
            w.start()
        for w in ws:
            w.join()

    loops = [threading.Thread(target=greedy_loop, args=(k,)) for k in greedy.values()]
    for th in loops:
        th.start()
    try:
        # every greedy key had its turn (round robin: five answers), and they fill the queue
        wait_for(lambda: len(ended) >= 5, 60, "every greedy key served once")
        wait_for(lambda: (svc.snapshot().queue_length or 0) >= 8, 30, "the greedy keys fill the fair queue")
        conv = chat.new_conversation()
        sampling = SamplingParams(0.6, 0.95, 0.0, TOKENS)
        t = time.monotonic()
        turn = chat.send(conv.id, "hello from the page", sampling)
        places: set[int | None] = set()
        # its place while it waits, as the page shows it ("waiting for the GPU (n ahead)")
        while turn.view().phase == "waiting" and time.monotonic() - t < 30:
            places.add(turn.view().queued_ahead)
            time.sleep(0.02)
        first_wall = time.time()  # its first token (within the 20 ms of this look)
        assert turn.done.wait(60)
    finally:
        stop.set()
        for th in loops:
            th.join(120)
    assert turn.message.status == "complete", turn.message.error
    assert not errors, errors[:3]
    # at most one answer ahead of it: the one at the engine when it came (12 greedy requests wait meanwhile), from
    # when the gateway took the chat's request (its own record) to the chat's first token. Counted in answers, not
    # seconds: on a loaded 2-core box every answer is slower than `one`, alone, was
    rec = next(a for a in svc.activity(200) if a.key_name == PANEL_CHAT_KEY)
    assert rec.status == 200
    waited = first_wall - rec.time
    before = [e for e in ended if rec.time < e < first_wall]
    print(f"one answer alone {one:.2f} s; the chat's first token {waited:.2f} s after the gateway took it, "
          f"{len(before)} greedy answer(s) ended meanwhile; its places in the queue "
          f"{sorted(p for p in places if p is not None)}")
    assert len(before) <= 1, f"the chat waited {len(before)} answers ({waited:.2f} s; one alone takes {one:.2f} s)"

    # usage (the keys' table) and the panel's /metrics both carry the chat's tokens under its key
    def chat_usage() -> int:
        info = next((k for k in svc.list_keys() if k.name == PANEL_CHAT_KEY), None)
        return info.usage.completion_tokens if info is not None else 0

    wait_for(lambda: chat_usage() >= TOKENS, 10, "the chat's tokens in the usage table")

    def chat_metric() -> float:
        data, _ = svc.metrics()
        for fam in families(data, True):
            for s in fam.samples:
                if s.name == "moet_panel_gateway_tokens_total" and s.labels == {"key": PANEL_CHAT_KEY,
                                                                                 "kind": "completion"}:
                    return float(s.value)
        return 0.0

    wait_for(lambda: chat_metric() >= TOKENS, 10, "the chat's tokens in /metrics")

    # the gateway switched off: the chat goes to the engine directly, and the panel's key is revoked with it
    svc.stop()
    assert svc.chat_route() is None
    assert {k.name: k.status for k in svc.list_keys()}[PANEL_CHAT_KEY] == "revoked"


def test_the_access_tab_marks_the_chat_key_and_does_not_offer_to_revoke_it() -> None:
    from app.backend.gateway.keys import KeyInfo, Usage
    from app.backend.gateway.switch import GatewaySnapshot, GatewayState, GatewayView
    from app.ui.gateway import _active_names, keys_html

    def info(name: str) -> KeyInfo:
        return KeyInfo(name, "mpk-abcd…", "inference", "active", 0.0, None, None, Usage(1, 2, 3, 0, None))

    keys = (info("laptop"), info(PANEL_CHAT_KEY))
    table = keys_html(keys)
    assert f"<tr data-key='{PANEL_CHAT_KEY}'><td>{PANEL_CHAT_KEY} <small" in table and "(Chat tab)" in table
    assert _active_names(GatewayView(GatewaySnapshot(GatewayState.ON), keys, ())) == ["laptop"]

