"""Chat inputs bounded and typed (issue 13): strict import that stores nothing on failure, a message
size cap on every send path, and a damaged conversation that never breaks the Chat tab."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.backend.chat.client import SamplingParams
from app.backend.chat.conversations import MAX_MESSAGE_BYTES, ChatError

CARD = SamplingParams(1.0, 1.0, 0.05, 8)


def export(**conv_fields: object) -> dict:
    conv = {"id": "imp1", "title": "imported", "created": 1.7e9, "updated": 1.7e9, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "stats": {"ttft_s": 0.2, "completion_tokens": 3,
                                                            "sampling": {"temperature": 1.0, "max_tokens": 8}}}]}
    conv.update(conv_fields)
    return {"format": "moet-panel.chat", "version": 1, "conversation": conv}


def with_message(index: int, **fields: object) -> dict:
    data = export()
    data["conversation"]["messages"][index].update(fields)
    return data


@pytest.mark.parametrize("data, where", [
    pytest.param(export(updated="inf"), "conversation.updated", id="updated-string-inf"),
    pytest.param(export(created=float("inf")), "conversation.created", id="created-Infinity"),
    pytest.param(export(updated=float("nan")), "conversation.updated", id="updated-NaN"),
    pytest.param(with_message(1, stats={"ttft_s": "fast"}), "messages.1.stats.ttft_s", id="stats-non-numeric"),
    pytest.param(with_message(1, stats="fast"), "messages.1.stats", id="stats-not-an-object"),
    pytest.param(with_message(1, stats={"completion_tokens": 2.5}), "completion_tokens", id="tokens-not-int"),
    pytest.param(with_message(0, role="tool"), "messages.0.role", id="unknown-role"),
    pytest.param(with_message(0, status="weird"), "messages.0.status", id="unknown-status"),
    pytest.param(with_message(0, content=["x"]), "messages.0.content", id="content-not-text"),
    pytest.param(with_message(0, content="x" * (4 * 1024 * 1024 + 1)), "messages.0.content", id="content-too-big"),
    pytest.param(export(id="../../x"), "conversation.id", id="bad-id"),
    pytest.param(export(messages="none"), "conversation.messages", id="messages-not-a-list"),
])
def test_bad_import_is_refused_with_the_field_named_and_stores_nothing(service, data: dict, where: str,
                                                                       tmp_path: Path) -> None:
    before = service.list_conversations()
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ChatError) as info:
        service.import_file(path)
    assert where in str(info.value) and "bad.json" in str(info.value)
    assert service.list_conversations() == before


def test_good_import_round_trips(service) -> None:
    conv = service.import_json(json.dumps(export()))
    again = service.get(conv.id)
    assert [m.content for m in again.messages] == ["hi", "hello"]
    assert again.messages[1].stats.ttft_s == 0.2 and again.messages[1].stats.sampling["max_tokens"] == 8


def test_message_size_is_capped_on_every_send_path(service) -> None:
    conv = service.new_conversation()
    big = "é" * (MAX_MESSAGE_BYTES // 2 + 1)  # two UTF-8 bytes each: just over the cap
    for send in (lambda: service.send(conv.id, big, CARD),
                 lambda: service.send_composed(conv.id, big, CARD),
                 lambda: service.send_composed(conv.id, "ok", CARD, system_prompt=big),
                 lambda: service.edit_last(conv.id, big, CARD),
                 lambda: service.set_system_prompt(conv.id, big)):
        with pytest.raises(ChatError, match=f"limit is {MAX_MESSAGE_BYTES // 1024} KiB"):
            send()
    assert service.get(conv.id).messages == [] and service.get(conv.id).system_prompt == ""
    fits = "a" * (MAX_MESSAGE_BYTES - 10)
    turn = service.send(conv.id, fits, CARD)
    assert turn.done.wait(20)


@pytest.mark.browser
def test_a_damaged_conversation_shows_an_error_and_can_be_deleted(panel, browser) -> None:
    """Issue 13, medium: one bad imported chat broke the Chat tab on every load and could not be
    deleted from the UI. A row as an older, laxer import wrote it, straight into chat.sqlite."""
    chat = panel.state.chat
    good = chat.new_conversation("a good one")
    db = sqlite3.connect(str(panel.state.settings.state_dir / "chat.sqlite"))
    db.execute("INSERT INTO conversations(id, title, system_prompt, created, updated) VALUES (?,?,?,?,?)",
               ("damaged", "damaged chat", "", 1.0, 9e18))
    db.execute("INSERT INTO messages(conversation_id, role, content, reasoning, status, error, stats, created) "
               "VALUES ('damaged', 'assistant', 'x', '', 'complete', '', ?, 1.0)", (json.dumps({"ttft_s": "fast"}),))
    db.commit()
    db.close()
    page = browser.new_page()
    page.goto(panel.url)
    page.get_by_role("tab", name="Chat").click()
    page.locator("#chat-bot", has_text="This conversation cannot be shown").wait_for()
    page.on("dialog", lambda d: d.accept())
    page.click("#chat-delete")
    page.locator("#chat-convs", has_text="a good one").wait_for()
    page.wait_for_function("() => !document.querySelector('#chat-convs').innerText.includes('damaged chat')")
    assert [s.id for s in chat.list_conversations()] == [good.id]
