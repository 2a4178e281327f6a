"""ChatService end to end against the SIMULATED engine: stats, stop, crash, persistence, export."""

from __future__ import annotations

import json

import pytest

from app.backend.chat.client import SamplingParams
from app.backend.chat.conversations import ChatError
from app.backend.chat.store import INTERRUPTED
from app.backend.contracts import EngineState
from app.backend.web.exports import exports_dir

from tests.chat.chat_helpers import FakeEngine, start_sim
from tests.polling import wait_for

CARD = SamplingParams(1.0, 1.0, 0.05, None)
LONG = {"ignore_eos": True}  # the sim then decodes until max_tokens


def finish(turn, timeout: float = 20.0):
    assert turn.done.wait(timeout), "reply did not finish"
    return turn.message


def test_reply_has_reasoning_answer_and_profile_stats(service, sim) -> None:
    conv = service.new_conversation()
    turn = service.send(conv.id, "Explain the delta tier.", CARD)
    msg = finish(turn)
    assert msg.status == "complete" and msg.reasoning and msg.content
    assert msg.reasoning_s is not None and msg.reasoning_s >= 0
    st = msg.stats
    assert st.profile_id == "balanced" and st.simulated is True
    assert st.model == sim.config.served_name and st.base_url == sim.base_url
    # the server counts the request after its last chunk has gone out, so the client can be first
    wait_for(lambda: sim.stats.completed == 1, what="the sim to count the finished request")
    assert st.completion_tokens == sim.stats.tokens and not st.tokens_estimated
    assert st.prompt_tokens and st.prompt_tokens > 0
    assert st.ttft_s is not None and 0 < st.ttft_s < st.wall_s
    assert st.decode_tok_s and st.decode_tok_s > 100  # sim decodes at 2000 tok/s
    assert st.sampling == {"temperature": 1.0, "top_p": 1.0, "min_p": 0.05, "max_tokens": None}
    assert service.get(conv.id).title == "Explain the delta tier."


def test_profile_is_the_one_serving_at_request_time(make_service, engine) -> None:
    svc = make_service(engine)
    conv = svc.new_conversation()
    engine.profile_id = "quality"
    first = finish(svc.send(conv.id, "one", CARD))
    engine.profile_id = "speed"
    second = finish(svc.send(conv.id, "two", CARD))
    assert (first.stats.profile_id, second.stats.profile_id) == ("quality", "speed")


def test_follow_coalesces_updates(service) -> None:
    conv = service.new_conversation()
    turn = service.send(conv.id, "long one", SamplingParams(1.0, 1.0, 0.05, 3000), extra_body=LONG)
    views = list(turn.follow(interval_s=0.1))
    final = views[-1]
    assert final.done and final.message.status == "complete"
    assert final.message.stats.completion_tokens == 3000
    # 3000 tokens at 2000 tok/s ≈ 1.5 s: about 15 coalesced updates, not one per token.
    assert len(views) < 60
    assert final.content == final.message.content and len(final.content) > 1000


def test_stop_aborts_on_the_server_and_keeps_the_partial(make_service, tmp_path) -> None:
    sim = start_sim(decode_tok_s=200.0)
    try:
        svc = make_service(FakeEngine(sim))
        conv = svc.new_conversation()
        turn = svc.send(conv.id, "write a lot", SamplingParams(1.0, 1.0, 0.05, 20000), extra_body=LONG)
        wait_for(lambda: turn.view().tokens >= 30, what="some tokens")
        stopped = svc.stop(conv.id)
        assert stopped is not None and stopped.status == "stopped"
        assert stopped.reasoning or stopped.content
        assert stopped.stats.completion_tokens < 20000
        wait_for(lambda: sim.stats.aborted == 1, what="the sim to record the disconnect")
        assert sim.stats.completed == 0
        # persisted as stopped, with its partial text
        again = make_service(None, state_dir=tmp_path / "state").get(conv.id).messages[-1]
        assert again.status == "stopped" and (again.content, again.reasoning) == (stopped.content, stopped.reasoning)
    finally:
        sim.stop()


def test_engine_crash_mid_stream_keeps_partial_with_diagnosis(make_service) -> None:
    sim = start_sim(fail="crash_mid_generation", crash_after_tokens=40)
    try:
        svc = make_service(FakeEngine(sim))
        conv = svc.new_conversation()
        msg = finish(svc.send(conv.id, "hello", CARD))
        assert msg.status == "error"
        assert len((msg.reasoning + msg.content).split()) >= 10  # the partial text is kept
        assert "broke mid-answer" in msg.error or "before the answer finished" in msg.error
        assert "Engine core crashed mid-generation" in msg.error and "Restart the engine" in msg.error
    finally:
        sim.stop()


def test_engine_stopped_mid_stream_without_controller(make_service) -> None:
    sim = start_sim(decode_tok_s=300.0)
    try:
        svc = make_service(None)  # no controller: the recipe endpoint, probed
        # the recipe's endpoint: this in-process engine's TCP port (a recipe with listen = "tcp")
        serve = svc.recipe.serve.model_copy(update={"port": sim.port, "listen": "tcp"})
        svc.recipe = svc.recipe.model_copy(update={"serve": serve})
        conv = svc.new_conversation()
        turn = svc.send(conv.id, "hello", SamplingParams(1.0, 1.0, 0.05, 5000), extra_body=LONG)
        wait_for(lambda: turn.view().tokens >= 10, what="some tokens")
        sim.stop()
        msg = finish(turn)
        assert msg.status == "error" and "moet-panel engine status" in msg.error
        assert msg.reasoning or msg.content
    finally:
        sim.stop()


def test_not_ready_engine_refuses_with_the_reason(service, engine) -> None:
    engine.state = EngineState.STARTING
    conv = service.new_conversation()
    with pytest.raises(ChatError, match="starting.*Engine tab"):
        service.send(conv.id, "hi", CARD)
    assert service.get(conv.id).messages == []  # nothing half-sent
    assert not service.endpoint().ready


def test_temperature_zero_warns_with_the_card(service, recipe) -> None:
    assert service.sampling_warnings(CARD) == []
    warnings = service.sampling_warnings(SamplingParams(0.0, 1.0, 0.05, None))
    assert len(warnings) == 1 and recipe.sampling.never_zero_note in warnings[0]
    assert service.default_sampling().temperature == recipe.sampling.temperature == 1.0
    assert service.default_sampling().min_p == 0.05


def test_default_max_tokens_never_exceeds_the_context(service, recipe) -> None:
    # vLLM refuses max_tokens > max_model_len (HTTP 400), seen with a 2048-token model (docs/real-engine.md)
    assert service.default_sampling().max_tokens == 32768  # the card's 256K context leaves the card's figure
    service.recipe = recipe.model_copy(update={"context": recipe.context.model_copy(update={"validated_max_tokens": 2048})})
    assert service.default_sampling().max_tokens == 2048


def test_history_survives_a_restart(make_service, engine, tmp_path) -> None:
    svc = make_service(engine)
    conv = svc.new_conversation(system_prompt="Be brief.")
    finish(svc.send(conv.id, "first", CARD))
    finish(svc.send(conv.id, "second", CARD))
    svc.rename(conv.id, "Kept")
    before = svc.get(conv.id)
    svc.close()
    again = make_service(engine, state_dir=tmp_path / "state")
    assert [s.title for s in again.list_conversations()] == ["Kept"]
    after = again.get(conv.id)
    assert after.system_prompt == "Be brief."
    assert [(m.role, m.content, m.reasoning, m.status) for m in after.messages] == \
        [(m.role, m.content, m.reasoning, m.status) for m in before.messages]
    assert after.messages[-1].stats == before.messages[-1].stats
    # and the restored conversation continues
    finish(again.send(conv.id, "third", CARD))
    assert len(again.get(conv.id).messages) == 6


def test_reply_cut_by_a_panel_crash_is_marked_on_reload(make_service, engine, tmp_path) -> None:
    svc = make_service(engine)
    conv = svc.new_conversation()
    from app.backend.chat.models import Message

    svc._store.add_message(conv, Message(role="assistant", content="half an ans", status="streaming"))
    again = make_service(engine, state_dir=tmp_path / "state")
    msg = again.get(conv.id).messages[-1]
    assert (msg.status, msg.error, msg.content) == ("stopped", INTERRUPTED, "half an ans")


def test_export_round_trip_and_markdown(service) -> None:
    conv = service.new_conversation(system_prompt="sys")
    finish(service.send(conv.id, "question?", CARD))
    text = service.export_json(conv.id)
    data = json.loads(text)
    assert data["format"] == "moet-panel.chat" and len(data["conversation"]["messages"]) == 2
    imported = service.import_json(text)
    assert imported.id != conv.id  # same id exists here: imported as a copy
    original = service.get(conv.id)
    assert [m.to_dict() | {"id": None} for m in imported.messages] == [m.to_dict() | {"id": None} for m in original.messages]
    assert imported.system_prompt == "sys" and imported.title == original.title
    md = service.export_markdown(conv.id)
    assert "## User" in md and "question?" in md and "<summary>Thinking" in md
    assert "profile balanced" in md and "SIMULATED" in md
    path = service.export_file(conv.id, "md")
    assert path.read_text() == md and path.suffix == ".md"
    with pytest.raises(ChatError, match="not a moet-panel chat export"):
        bad = path.with_suffix(".json")
        bad.write_text('{"hello": 1}')
        service.import_file(bad)


def test_regenerate_edit_clear_delete(service, sim) -> None:
    conv = service.new_conversation()
    finish(service.send(conv.id, "first question", CARD))
    finish(service.regenerate(conv.id, CARD))
    msgs = service.get(conv.id).messages
    assert [m.role for m in msgs] == ["user", "assistant"]
    finish(service.edit_last(conv.id, "edited question", CARD))
    msgs = service.get(conv.id).messages
    assert [(m.role, m.content) for m in msgs][0] == ("user", "edited question") and len(msgs) == 2
    assert sim.stats.requests == 3
    service.clear(conv.id)
    assert service.get(conv.id).messages == []
    service.delete(conv.id)
    assert service.list_conversations() == []
    with pytest.raises(ChatError, match="does not exist"):
        service.get(conv.id)


def test_one_reply_at_a_time_per_conversation(make_service) -> None:
    sim = start_sim(decode_tok_s=200.0)
    try:
        svc = make_service(FakeEngine(sim))
        conv = svc.new_conversation()
        svc.send(conv.id, "long", SamplingParams(1.0, 1.0, 0.05, 5000), extra_body=LONG)
        with pytest.raises(ChatError, match="still streaming"):
            svc.send(conv.id, "again", CARD)
        svc.stop(conv.id)
    finally:
        sim.stop()


def test_history_write_failure_loses_nothing_and_says_why(service, sim, monkeypatch) -> None:
    from app.backend.chat.store import ChatStoreError

    conv = service.new_conversation()

    def full_disk(*_a, **_k):
        raise ChatStoreError("chat history /x/chat.sqlite: database or disk is full")

    monkeypatch.setattr(service._store, "add_message", full_disk)
    with pytest.raises(ChatError, match="not sent.*disk is full"):
        service.send(conv.id, "hello", CARD)
    assert service.get(conv.id).messages == []  # the UI keeps the typed text; nothing half-stored
    assert service.active_turn(conv.id) is None
    monkeypatch.undo()
    assert finish(service.send(conv.id, "hello", CARD)).status == "complete"


def test_stop_during_a_long_prefill_is_immediate(make_service) -> None:
    """No token yet (the engine is still reading a long prompt): Stop must not wait for one."""
    import time

    sim = start_sim(prefill_tok_s=20.0)  # a 200-token prompt takes ~10 s before the first token
    try:
        svc = make_service(FakeEngine(sim))
        conv = svc.new_conversation()
        turn = svc.send(conv.id, "word " * 200, CARD)
        wait_for(lambda: sim.stats.requests == 1, what="the request to reach the engine")
        t0 = time.monotonic()
        msg = svc.stop(conv.id, timeout=5.0)
        assert time.monotonic() - t0 < 2.0
        assert msg is not None and msg.status == "stopped" and msg.content == ""
        assert turn.view().done
        wait_for(lambda: sim.stats.aborted == 1, what="the engine to see the disconnect")
    finally:
        sim.stop()


def test_a_send_based_on_an_old_view_is_refused_and_changes_nothing(service) -> None:
    """Issue 29 item 6: a second tab's send used turns it never showed as context."""
    from app.backend.chat.client import SamplingParams
    from app.backend.chat.conversations import ConversationMoved

    card = SamplingParams(1.0, 1.0, 0.05, 8)
    conv = service.new_conversation()
    seen = service.revision(conv.id)  # what a page shows
    assert service.send(conv.id, "from another tab", card).done.wait(20)
    assert service.revision(conv.id) > seen
    with pytest.raises(ConversationMoved, match="changed in another tab"):
        service.send_composed(conv.id, "stale", card, expected_revision=seen)
    with pytest.raises(ConversationMoved):
        service.regenerate(conv.id, card, expected_revision=seen)
    assert [m.content for m in service.get(conv.id).messages if m.role == "user"] == ["from another tab"]
    turn, _ = service.send_composed(conv.id, "fresh", card, expected_revision=service.revision(conv.id))
    assert turn.done.wait(20)
    before = service.list_revision()
    service.rename(conv.id, "renamed")
    assert service.list_revision() > before


def test_export_is_named_after_the_whole_title_and_kept_private(service, tmp_path) -> None:
    conv = service.new_conversation("A rather long conversation title that used to be cut at forty characters")
    path = service.export_file(conv.id, "md")
    assert path.parent == exports_dir(service._state_dir) and path.parent.name == "exports"
    assert path.name == f"A-rather-long-conversation-title-that-used-to-be-cut-at-forty-characters-{conv.id[:8]}.md"
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    service.close()  # the browser has its copy: nothing is left behind
    assert not path.exists()


def test_regenerate_gives_another_answer_on_the_simulated_engine(service, sim) -> None:
    """Issue 42: Regenerate in demo mode returned the identical text (the SIMULATED engine answers a seedless
    request the same way each time), so it looked as if nothing happened."""
    conv = service.new_conversation()
    finish(service.send(conv.id, "Explain the delta tier.", CARD))
    first = service.get(conv.id).messages[-1].content
    answers = {first}
    for _ in range(2):
        finish(service.regenerate(conv.id, CARD))
        answers.add(service.get(conv.id).messages[-1].content)
    assert len(answers) == 3, answers
