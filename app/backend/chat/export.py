"""Export a conversation as JSON (lossless; importable) or Markdown (for reading and sharing)."""

from __future__ import annotations

import json
import time
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from app.backend.chat.models import Conversation, Message, MessageStats
from app.backend.chat.stats import format_stats

FORMAT = "moet-panel.chat"
VERSION = 1


class ChatImportError(ValueError):
    """The file is not a moet-panel chat export (the message says what is wrong)."""


def to_json(conv: Conversation) -> str:
    data: dict[str, object] = {
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


# Import limits (docs/chat.md#import): a reply of 32k tokens is ~150 KB; its thinking can be longer.
MAX_IMPORT_BYTES = 16 * 1024 * 1024  # the panel's upload cap (app.backend.web.gate.MAX_UPLOAD_BYTES)
MAX_TEXT_BYTES = 4 * 1024 * 1024  # one message's content, reasoning or error
MAX_MESSAGES = 10_000
MAX_TIME = 1e11  # seconds since 1970 (year 5138): anything beyond is not a timestamp

_Time = Annotated[float, Field(ge=0, le=MAX_TIME, allow_inf_nan=False)]
_Seconds = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]
_Count = Annotated[int, Field(ge=0, le=10**9)]
_Short = Annotated[str, Field(max_length=2000)]


def _text_limit(value: str) -> str:
    if len(value.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise ValueError(f"longer than {MAX_TEXT_BYTES // (1024 * 1024)} MiB")
    return value


_Text = Annotated[str, AfterValidator(_text_limit)]


class _Strict(BaseModel):
    # strict: no "1.5" → 1.5 or 1 → True coercions; unknown keys are ignored (newer exports).
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class _StatsIn(_Strict):
    profile_id: _Short | None = None
    simulated: bool = False
    model: _Short = ""
    base_url: _Short = ""
    ttft_s: _Seconds | None = None
    decode_tok_s: Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)] | None = None
    prompt_tokens: _Count | None = None
    completion_tokens: _Count | None = None
    tokens_estimated: bool = False
    wall_s: _Seconds | None = None
    finish_reason: Annotated[str, Field(max_length=64)] | None = None
    sampling: Annotated[dict[Annotated[str, Field(max_length=64)],
                             int | Annotated[float, Field(allow_inf_nan=False)] | None], Field(max_length=16)] = {}


class _MessageIn(_Strict):
    role: Literal["system", "user", "assistant"]
    content: _Text = ""
    reasoning: _Text = ""
    reasoning_s: _Seconds | None = None
    status: Literal["complete", "streaming", "stopped", "error"] = "complete"
    error: _Text = ""
    stats: _StatsIn | None = None
    created: _Time | None = None


class _ConversationIn(_Strict):
    id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    title: Annotated[str, Field(max_length=500)] = "Imported chat"
    system_prompt: _Text = ""
    created: _Time | None = None
    updated: _Time | None = None
    messages: Annotated[list[_MessageIn], Field(max_length=MAX_MESSAGES)] = []


def _where(err: ErrorDetails) -> str:
    return ".".join(str(part) for part in err.get("loc", ())) or "conversation"


def from_json(text: str) -> Conversation:
    """Parse and validate an export completely (types, finite numbers, sizes) before anything is
    stored; ChatImportError names the first bad field. The caller gives it a fresh id if one with
    this id exists already."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_IMPORT_BYTES:
        raise ChatImportError(f"the file is over {MAX_IMPORT_BYTES // (1024 * 1024)} MiB")
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ChatImportError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ChatImportError(f"not a moet-panel chat export (expected \"format\": \"{FORMAT}\")")
    if data.get("version") != VERSION:
        raise ChatImportError(f"unsupported export version {data.get('version')!r} (this panel reads {VERSION})")
    try:
        raw = _ConversationIn.model_validate(data.get("conversation"))
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise ChatImportError(f"conversation.{_where(first)}: {first['msg']}{more}") from None
    now = time.time()
    messages = [
        Message(role=m.role, content=m.content, reasoning=m.reasoning, reasoning_s=m.reasoning_s, status=m.status,
                error=m.error, stats=MessageStats(**m.stats.model_dump()) if m.stats else None,
                created=m.created if m.created is not None else now)
        for m in raw.messages
    ]
    return Conversation(id=raw.id, title=" ".join(raw.title.split())[:120] or "Imported chat",
                        system_prompt=raw.system_prompt, created=raw.created if raw.created is not None else now,
                        updated=raw.updated if raw.updated is not None else now, messages=messages)


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


def _without_id(msg: Message) -> dict[str, object]:
    data = msg.to_dict()
    data.pop("id", None)
    return data


def _quote(text: str) -> str:
    return "\n".join("> " + line for line in text.splitlines())
