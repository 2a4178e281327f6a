"""Conversation data model (plain dataclasses; persisted by store.py, exported by export.py)."""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Literal

from app.backend.contracts import JsonObject

Role = Literal["system", "user", "assistant"]
# streaming: reply in progress (a crash of the panel leaves it; reloading marks it stopped)
Status = Literal["complete", "streaming", "stopped", "error"]
DEFAULT_TITLE = "New chat"


@dataclass
class MessageStats:
    """Measured for one reply, plus what served it (profile and endpoint at request time)."""

    profile_id: str | None = None
    simulated: bool = False
    model: str = ""
    base_url: str = ""
    ttft_s: float | None = None  # request sent -> first token of any kind (reasoning or answer)
    decode_tok_s: float | None = None  # (completion tokens - 1) / (last token - first token)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tokens_estimated: bool = False  # no usage chunk: completion tokens counted from deltas
    wall_s: float | None = None
    finish_reason: str | None = None
    sampling: dict[str, object] = field(default_factory=dict)
    build: str = ""  # the engine build that answered ("" for replies before issue 45 or outside the panel)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: JsonObject | None) -> "MessageStats | None":
        if not data:
            return None
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class Message:
    role: Role
    content: str
    reasoning: str = ""
    reasoning_s: float | None = None  # how long the model thought (first reasoning -> first answer token)
    status: Status = "complete"
    error: str = ""
    stats: MessageStats | None = None
    created: float = field(default_factory=time.time)
    id: int | None = None  # row id once stored

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["stats"] = self.stats.to_dict() if self.stats else None
        return data


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    title: str = DEFAULT_TITLE
    system_prompt: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    messages: list[Message] = field(default_factory=list)


@dataclass(frozen=True)
class ConversationSummary:
    id: str
    title: str
    updated: float
    message_count: int


def title_from_prompt(text: str, limit: int = 48) -> str:
    """First line of the first prompt, shortened: the automatic conversation title."""
    line = " ".join(text.strip().split())
    return (line[: limit - 1] + "…") if len(line) > limit else (line or DEFAULT_TITLE)
