"""Export a conversation as JSON (lossless; importable) or Markdown (for reading and sharing)."""

from __future__ import annotations

import json
import time
from typing import Any

from app.backend.chat.models import Conversation, Message
from app.backend.chat.stats import format_stats

FORMAT = "moet-panel.chat"
VERSION = 1


class ChatImportError(ValueError):
    """The file is not a moet-panel chat export (the message says what is wrong)."""


def to_json(conv: Conversation) -> str:
    data: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "exported": time.time(),
        "conversation": {
            "id": conv.id,
            "title": conv.title,
            "system_prompt": conv.system_prompt,
            "created": conv.created,
            "updated": conv.updated,
            "messages": [_without_id(m) for m in conv.messages],
        },
    }
    return json.dumps(data, ensure_ascii=False, indent=2)


def from_json(text: str) -> Conversation:
    """Parse an export. The caller gives it a fresh id if one with this id exists already."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ChatImportError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ChatImportError(f"not a moet-panel chat export (expected \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise ChatImportError(f"unsupported export version {data.get('version')!r} (this panel reads {VERSION})")
    raw = data.get("conversation") or {}
    try:
        messages = [Message.from_dict(m) for m in raw.get("messages", [])]
        return Conversation(
            id=str(raw["id"]),
            title=str(raw.get("title") or "Imported chat"),
            system_prompt=str(raw.get("system_prompt") or ""),
            created=float(raw.get("created") or time.time()),
            updated=float(raw.get("updated") or time.time()),
            messages=messages,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ChatImportError(f"malformed conversation: {exc}") from exc


def to_markdown(conv: Conversation) -> str:
    lines = [f"# {conv.title}", ""]
    if conv.system_prompt:
        lines += ["**System prompt**", "", _quote(conv.system_prompt), ""]
    for msg in conv.messages:
        if msg.role == "user":
            lines += ["## User", "", msg.content, ""]
            continue
        lines += ["## Assistant", ""]
        if msg.reasoning:
            took = f" ({msg.reasoning_s:.1f} s)" if msg.reasoning_s is not None else ""
            lines += [f"<details><summary>Thinking{took}</summary>", "", msg.reasoning, "", "</details>", ""]
        lines += [msg.content, ""]
        if msg.status == "stopped":
            lines += ["*(stopped — partial answer)*", ""]
        elif msg.status == "error":
            lines += [f"*(error: {msg.error})*", ""]
        if msg.stats:
            lines += [f"<sub>{format_stats(msg.stats)}</sub>", ""]
    return "\n".join(lines).rstrip() + "\n"


def _without_id(msg: Message) -> dict[str, Any]:
    data = msg.to_dict()
    data.pop("id", None)
    return data


def _quote(text: str) -> str:
    return "\n".join("> " + line for line in text.splitlines())
