"""The chat's quick start without a browser: Send tickets (fastpath.py), the route (fastroute.py)
on the real panel server, deferred history writes, and Turn.subscribe."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.backend.auth import add_user, load_users, make_checker
from app.backend.chat.client import SamplingParams
from app.backend.chat.fastpath import PageSend, TicketBook, TicketError
from app.backend.chat.fastroute import SEND_PATH
from app.backend.chat.service import ChatError, ChatService
from app.backend.chat.store import ChatStoreError
from tests.chat.chat_helpers import FakeEngine, chat_panel, start_sim, wait_for

CARD = SamplingParams(1.0, 1.0, 0.05, 64)


def page_send(conv_id: str, text: str = "Explain the delta tier.", **kw: object) -> PageSend:
    fields: dict[str, object] = dict(ticket=uuid.uuid4().hex, conv_id=conv_id, text=text, edit=False,
                                     system_prompt="", custom_url="", sampling=CARD)
    fields.update(kw)
    return PageSend(**fields)  # type: ignore[arg-type]


def starter(service: ChatService):
    return lambda s: service.send_composed(s.conv_id, s.text, s.sampling, edit=s.edit,
                                           system_prompt=s.system_prompt, defer_history=True)


# ---- PageSend ---------------------------------------------------------------------------------------

def test_page_send_from_json_accepts_the_page_fields_and_names_a_bad_one() -> None:
    body = {"ticket": "a" * 32, "conv_id": "c1", "text": "hi", "edit": False, "system_prompt": "be brief",
            "custom_url": " http://127.0.0.1:8000 ", "temperature": 1, "top_p": 1.0, "min_p": 0.05, "max_tokens": 512.0}
    send = PageSend.from_json(body)
    assert send.sampling == SamplingParams(1.0, 1.0, 0.05, 512) and send.custom_url == "http://127.0.0.1:8000"
    assert PageSend.from_json({**body, "max_tokens": None}).sampling.max_tokens is None
    for bad, field in (({**body, "ticket": "short"}, "ticket"), ({**body, "ticket": "a" * 31 + "/"}, "ticket"),
                       ({**body, "temperature": "hot"}, "temperature"), ({**body, "top_p": float("nan")}, "top_p"),
                       ({**body, "edit": "yes"}, "edit"), ({**body, "text": 5}, "text"), ([], "object")):
        with pytest.raises(TicketError, match=field):
            PageSend.from_json(bad)


def test_mismatch_names_each_differing_field() -> None:
    a = page_send("c1")
    assert a.mismatch(page_send("c1", text="  Explain the delta tier.\n")) == []  # the send strips the text
    b = page_send("c2", sampling=SamplingParams(0.5, 1.0, 0.05, 64), edit=True)
    assert a.mismatch(b) == ["conversation", "edit", "sampling"]


# ---- TicketBook -------------------------------------------------------------------------------------

@pytest.fixture
def slow(make_service) -> Iterator[tuple[ChatService, object]]:
    """A service on an engine slow enough that a reply is still streaming when a test acts."""
    sim = start_sim(decode_tok_s=40.0)
    try:
        yield make_service(FakeEngine(sim)), sim
    finally:
        sim.stop()


def test_claim_takes_over_the_started_turn_with_one_engine_request(service, sim) -> None:
    book = TicketBook()
    conv = service.new_conversation()
    send = page_send(conv.id)
    turn = book.start(send, starter(service))
    claim = book.claim(page_send(conv.id, ticket=send.ticket))
    assert claim is not None and claim.turn is turn and claim.first_message
    assert book.is_claimed(send.ticket)
    assert turn.done.wait(20) and turn.message.status == "complete"
    assert sim.stats.requests == 1
    with pytest.raises(TicketError):  # a ticket starts one reply only
        book.start(send, starter(service))


def test_claim_waits_for_a_fast_request_that_arrives_after_the_gradio_event(service, sim) -> None:
    book = TicketBook()
    conv = service.new_conversation()
    send = page_send(conv.id)
    got: list[object] = []
    claimer = threading.Thread(target=lambda: got.append(book.claim(send, timeout=10)))
    claimer.start()
    wait_for(lambda: len(book) == 1, what="the claim to wait for the ticket")
    turn = book.start(send, starter(service))
    claimer.join(10)
    assert got and got[0].turn is turn  # type: ignore[union-attr]
    assert turn.done.wait(20)


def test_a_claim_that_gives_up_refuses_the_late_fast_request(service, sim) -> None:
    book = TicketBook()
    conv = service.new_conversation()
    send = page_send(conv.id)
    assert book.claim(send, timeout=0.05) is None  # the Gradio event then sends itself
    with pytest.raises(TicketError, match="given up"):
        book.start(send, starter(service))
    assert sim.stats.requests == 0 and service.get(conv.id).messages == []


def test_a_refused_fast_start_makes_the_claim_fall_back(service, sim) -> None:
    book = TicketBook()
    send = page_send("no-such-conversation")
    with pytest.raises(ChatError):
        book.start(send, starter(service))
    assert book.claim(send, timeout=5) is None


def test_a_claim_that_disagrees_stops_that_reply_and_says_why(slow) -> None:
    service, sim = slow
    book = TicketBook()
    conv = service.new_conversation()
    send = page_send(conv.id, sampling=SamplingParams(1.0, 1.0, 0.05, None))  # a long reply
    turn = book.start(send, starter(service))
    with pytest.raises(TicketError, match="disagreed on sampling"):
        book.claim(page_send(conv.id, ticket=send.ticket, sampling=SamplingParams(0.7, 1.0, 0.05, None)))
    assert turn.done.wait(10) and turn.message.status == "stopped"
    wait_for(lambda: sim.stats.aborted == 1, what="the engine to see the disconnect")


def test_an_unclaimed_reply_is_stopped(slow) -> None:
    service, sim = slow
    book = TicketBook(unclaimed_s=0.2)
    conv = service.new_conversation()
    turn = book.start(page_send(conv.id, sampling=SamplingParams(1.0, 1.0, 0.05, None)), starter(service))
    assert turn.done.wait(10) and turn.message.status == "stopped"
    wait_for(lambda: sim.stats.aborted == 1, what="the engine to see the disconnect")


def test_released_before_the_claim_stops_unless_claimed_in_the_grace(slow) -> None:
    service, sim = slow
    book = TicketBook()
    conv = service.new_conversation()
    kept = page_send(conv.id, sampling=SamplingParams(1.0, 1.0, 0.05, None))
    turn = book.start(kept, starter(service))
    book.release(kept.ticket, grace_s=5.0)
    assert book.claim(page_send(conv.id, ticket=kept.ticket, sampling=kept.sampling)) is not None
    assert not turn.done.wait(0.3)  # claimed within the grace: it streams on
    turn.stop()
    left = page_send(conv.id, text="again", sampling=SamplingParams(1.0, 1.0, 0.05, None))
    turn2 = book.start(left, starter(service))
    book.release(left.ticket, grace_s=0.05)  # the page went away
    assert turn2.done.wait(10) and turn2.message.status == "stopped"


# ---- deferred history, Turn.subscribe ---------------------------------------------------------------

def test_deferred_history_is_written_after_the_first_token(make_service, tmp_path, monkeypatch) -> None:
    import app.backend.chat.service as service_mod

    monkeypatch.setattr(service_mod, "HISTORY_DELAY_MAX_S", 30.0)  # only the first token releases the write
    sim = start_sim(prefill_tok_s=5.0)  # a few seconds of "prefill" before the first token
    try:
        service = make_service(FakeEngine(sim))
        conv = service.new_conversation()
        turn, first = service.send_composed(conv.id, "hello", CARD, system_prompt="be brief", defer_history=True)
        reader = ChatService(service.recipe, tmp_path / "state")  # a second reader of the same DB
        assert first and reader.get(conv.id).messages == []  # nothing written while the engine prefills
        assert turn.done.wait(30)
        wait_for(lambda: turn.message.id is not None, what="the reply row")
        stored = ChatService(service.recipe, tmp_path / "state").get(conv.id)
        assert [m.role for m in stored.messages] == ["user", "assistant"]
        assert (stored.messages[1].reasoning, stored.messages[1].content) == (turn.message.reasoning, turn.message.content)
        assert stored.messages[1].reasoning and stored.system_prompt == "be brief" and stored.title == "hello"
        reader.close()
    finally:
        sim.stop()


def test_a_failed_deferred_write_is_shown_on_the_reply(service, sim, monkeypatch) -> None:
    conv = service.new_conversation()

    def full_disk(*_a, **_k):
        raise ChatStoreError("chat history: database or disk is full")

    monkeypatch.setattr(service._store, "add_message", full_disk)
    turn, _ = service.send_composed(conv.id, "hello", CARD, defer_history=True)
    assert turn.done.wait(20)
    assert turn.message.status == "complete" and "History not saved" in turn.message.error


def test_subscribe_wakes_on_text_and_once_done(service, sim) -> None:
    conv = service.new_conversation()
    turn = service.send(conv.id, "hi", CARD)
    wakes: list[int] = []
    unsubscribe = turn.subscribe(lambda: wakes.append(turn.view().version))
    assert turn.done.wait(20)
    wait_for(lambda: wakes and wakes[-1] == turn.view().version, what="the final wake")
    n = len(wakes)
    unsubscribe()
    late: list[int] = []
    turn.subscribe(lambda: late.append(1))  # subscribing to a finished turn wakes at once
    assert n >= 2 and late == [1]


# ---- the route on the real panel server -------------------------------------------------------------

@pytest.fixture
def panel(tmp_path: Path) -> Iterator[tuple[str, FakeEngine, object]]:
    with chat_panel(tmp_path / "data") as p:
        yield p


def body_for(conv_id: str, **kw: object) -> dict[str, object]:
    return {"ticket": uuid.uuid4().hex, "conv_id": conv_id, "text": "Explain the delta tier.", "edit": False,
            "system_prompt": "", "custom_url": "", "temperature": 1.0, "top_p": 1.0, "min_p": 0.05,
            "max_tokens": 64, **kw}


def sse_events(response: httpx.Response) -> Iterator[dict]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[6:])


def test_route_streams_the_reply_it_started(panel) -> None:
    url, engine, p = panel
    conv = p.state.chat.new_conversation()
    body = body_for(conv.id, max_tokens=None)  # the whole reply: thinking, then the answer
    with httpx.Client(timeout=20) as c, c.stream("POST", url + SEND_PATH, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r))
    assert events[0] == {"ev": "started"} and events[-1] == {"ev": "done", "status": "complete"}
    thinking = "".join(e["r"] for e in events if e["ev"] == "text")
    answer = "".join(e["c"] for e in events if e["ev"] == "text")
    msg = p.state.chat.get(conv.id).messages[-1]
    assert (thinking, answer) == (msg.reasoning, msg.content) and thinking and answer
    assert engine.sim.stats.requests == 1


def test_route_refuses_what_it_must(panel) -> None:
    url, engine, p = panel
    conv = p.state.chat.new_conversation()
    with httpx.Client(timeout=20) as c:
        cross = c.post(url + SEND_PATH, json=body_for(conv.id), headers={"Origin": "http://evil.example"})
        assert cross.status_code == 403
        plain = c.post(url + SEND_PATH, content=json.dumps(body_for(conv.id)), headers={"Content-Type": "text/plain"})
        assert plain.status_code == 415
        assert c.post(url + SEND_PATH, json={**body_for(conv.id), "ticket": "x"}).status_code == 400
        missing = c.post(url + SEND_PATH, json=body_for("no-such-conversation"))
        assert missing.status_code == 409 and "does not exist" in missing.json()["error"]
        same_origin = c.post(url + SEND_PATH, json=body_for(conv.id, max_tokens=1), headers={"Origin": url})
        assert same_origin.status_code == 200
    assert engine.sim.stats.requests == 1  # only the same-origin one reached the engine


@pytest.fixture
def auth_checker(tmp_path: Path):
    path = tmp_path / "auth"
    add_user(path, "alice", "correct horse battery")
    return make_checker(load_users(path))


def test_route_needs_the_panel_login_when_auth_is_on(tmp_path: Path, auth_checker) -> None:
    with chat_panel(tmp_path / "data", auth=auth_checker) as (url, engine, p):
        conv = p.state.chat.new_conversation()
        with httpx.Client(timeout=20) as c:
            anon = c.post(url + SEND_PATH, json=body_for(conv.id))
            assert anon.status_code == 401
            assert engine.sim.stats.requests == 0 and p.state.chat.get(conv.id).messages == []
            login = c.post(url + "/login", data={"username": "alice", "password": "correct horse battery"})
            assert login.status_code == 200
            ok = c.post(url + SEND_PATH, json=body_for(conv.id, max_tokens=1))
            assert ok.status_code == 200 and '"ev":"done"' in ok.text
        assert engine.sim.stats.requests == 1


def test_route_leaves_replies_past_the_stream_limit_to_the_queue(tmp_path: Path) -> None:
    """Gradio's queue bounds its own chat events; the route must not start replies past the same bound."""
    with chat_panel(tmp_path / "data", decode_tok_s=20.0) as (url, engine, p):
        chat = p.state.chat
        chat.max_streams = 1
        busy, other = chat.new_conversation(), chat.new_conversation()
        chat.send_composed(busy.id, "Explain the delta tier.", SamplingParams(1.0, 1.0, 0.05, None))
        with httpx.Client(timeout=20) as c:
            refused = c.post(url + SEND_PATH, json=body_for(other.id))
            assert refused.status_code == 409 and "its limit of 1 replies" in refused.json()["error"]
            assert engine.sim.stats.requests == 1 and chat.get(other.id).messages == []
            chat.stop(busy.id)
            ok = c.post(url + SEND_PATH, json=body_for(other.id, max_tokens=1))
            assert ok.status_code == 200 and '"ev":"done"' in ok.text
        assert engine.sim.stats.requests == 2
