"""A/B prompts picked from chat history: the user turns of stored conversations (app/backend/chat/).

A turn is picked by a selector `CONV` (every user turn of a conversation) or `CONV:2,4` (its 2nd and
4th user turns, counted from 1); CONV is a conversation id or a unique prefix of one (at least 4
characters). With `context`, a turn is sent after the conversation's system prompt and its earlier
turns as stored (the same context for A and B, so the comparison stays paired); without, alone.
See docs/selftest.md ("Prompts from chat history").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from app.backend.abtest.journal import Prompt, Turn
from app.backend.chat.models import Conversation, ConversationSummary
from app.backend.chat.conversations import ChatError, ChatService
from app.backend.chat.store import ChatStore

MIN_PREFIX = 4


@dataclass(frozen=True)
class ChatTurn:
    conv_id: str
    conv_title: str
    turn: int  # 1-based among the conversation's user messages
    text: str
    context: tuple[Turn, ...]  # system prompt and the earlier messages, in order

    @property
    def key(self) -> str:
        """The selector of exactly this turn (`CONV:N`); also the Compare tab's choice value."""
        return f"{self.conv_id}:{self.turn}"

    def short(self, width: int = 70) -> str:
        line = " ".join(self.text.split())
        return line if len(line) <= width else line[: width - 1] + "…"

    def label(self, width: int = 70) -> str:
        more = f" (+{len(self.context)} earlier)" if self.context else ""
        return f"{self.conv_title} · turn {self.turn}{more}: {self.short(width)}"

    def to_prompt(self, with_context: bool) -> Prompt:
        return Prompt("", self.text, f"chat {self.conv_id} turn {self.turn}", self.context if with_context else ())


@dataclass(frozen=True)
class ChatHistory:
    """Read access to the chat store: the panel's ChatService or a store opened read-only (the CLI)."""

    list_fn: Callable[[], list[ConversationSummary]]
    load_fn: Callable[[str], Conversation | None]

    def conversations(self) -> list[ConversationSummary]:
        return self.list_fn()

    def turns(self, conv_id: str) -> list[ChatTurn]:
        conv = self.load_fn(conv_id)
        return user_turns(conv) if conv is not None else []


def user_turns(conv: Conversation) -> list[ChatTurn]:
    """Every non-empty user message of a conversation, each with what came before it."""
    context: list[Turn] = [("system", conv.system_prompt)] if conv.system_prompt.strip() else []
    out: list[ChatTurn] = []
    for m in conv.messages:
        if m.role == "user" and m.content.strip():
            out.append(ChatTurn(conv.id, conv.title, len(out) + 1, m.content, tuple(context)))
        if m.role in ("user", "assistant") and m.content.strip():  # a failed reply with no text adds nothing
            context.append((m.role, m.content))
    return out


def resolve_conversation(history: ChatHistory, ref: str) -> ConversationSummary:
    ref = ref.strip()
    convs = history.conversations()
    exact = [c for c in convs if c.id == ref]
    if exact:
        return exact[0]
    if len(ref) < MIN_PREFIX:
        raise ValueError(f"conversation {ref!r}: give at least {MIN_PREFIX} characters of its id (abtest chat-prompts lists them)")
    found = [c for c in convs if c.id.startswith(ref)]
    if not found:
        raise ValueError(f"no conversation {ref!r} in the chat history ({len(convs)} stored; abtest chat-prompts lists them)")
    if len(found) > 1:
        raise ValueError(f"conversation {ref!r} is ambiguous: {', '.join(c.id[:12] for c in found)}")
    return found[0]


def pick_turns(history: ChatHistory, selectors: list[str]) -> list[ChatTurn]:
    """The turns the selectors name, in the order given (`CONV` or `CONV:N[,N...]`)."""
    out: list[ChatTurn] = []
    for sel in selectors:
        ref, _, nums = sel.partition(":")
        conv = resolve_conversation(history, ref)
        turns = history.turns(conv.id)
        if not turns:
            raise ValueError(f"conversation {conv.id[:12]} ({conv.title!r}) has no user turns")
        if not nums.strip():
            out += turns
            continue
        for raw in nums.split(","):
            try:
                n = int(raw)
            except ValueError:
                raise ValueError(f"{sel!r}: turn numbers are 1, 2, ... separated by commas, got {raw!r}") from None
            if not 1 <= n <= len(turns):
                raise ValueError(f"conversation {conv.id[:12]} ({conv.title!r}) has user turns 1..{len(turns)}, not {n}")
            out.append(turns[n - 1])
    return out


def history_of_service(chat: ChatService) -> ChatHistory:
    """The panel's chat service (the Compare tab): a conversation deleted meanwhile reads as empty."""

    def load(conv_id: str) -> Conversation | None:
        try:
            return chat.get(conv_id)
        except ChatError:
            return None

    return ChatHistory(chat.list_conversations, load)


def history_of_store(store: ChatStore) -> ChatHistory:
    """A chat store opened read-only beside a running panel (the CLI)."""
    return ChatHistory(store.list, store.load)
