"""A chat request streamed as the small event vocabulary of `events.py`, from any OpenAI-compatible endpoint
(vLLM, the simulated engine, others) through the one engine client (`engine/runtime/client.py`, the openai SDK).

Reasoning is read from `delta.reasoning` (vLLM >= late 2025), then `delta.reasoning_content` (older servers,
DeepSeek's name), and inline `<think>` tags.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from app.backend.chat.events import (
    ChatEvent, ContentDelta, Finished, ReasoningDelta, ReclassifyAsReasoning, StreamError, UsageReport,
)
from app.backend.chat.think import ThinkSplitter
from app.backend.engine.runtime.client import CompletionStream, EngineClient, StreamFailure


@dataclass(frozen=True)
class SamplingParams:
    temperature: float
    top_p: float
    min_p: float
    max_tokens: int | None = None


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, str]]  # [{"role": "system"|"user"|"assistant", "content": str}]
    sampling: SamplingParams
    extra_body: dict[str, object] = field(default_factory=dict)

    def body(self) -> dict[str, object]:
        s = self.sampling
        body: dict[str, object] = {
            "model": self.model,
            "messages": self.messages,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "min_p": s.min_p,  # a vLLM extra, not an OpenAI field (docs/chat.md)
            **self.extra_body,
        }
        if s.max_tokens:
            body["max_tokens"] = s.max_tokens
        return body


class ChatStream:
    """Iterate for events. `abort()` may be called from any thread: it unblocks a pending read and
    closes the connection, which makes vLLM abort the request (docs/chat.md)."""

    def __init__(self, client: EngineClient, request: ChatRequest):
        self._stream: CompletionStream = client.stream_chat(request.body())

    @property
    def aborted(self) -> bool:
        return self._stream.aborted

    def __iter__(self) -> Iterator[ChatEvent]:
        try:
            yield from self._events()
        finally:
            self._stream.close()

    def abort(self) -> None:
        self._stream.abort()

    def _events(self) -> Iterator[ChatEvent]:
        splitter = ThinkSplitter()
        finish: str | None = None
        try:
            for chunk in self._stream:
                now = time.monotonic()
                usage = chunk.get("usage")
                if usage:
                    yield UsageReport(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                                      int(usage.get("total_tokens") or 0), now)
                choices = chunk.get("choices")
                if not choices:  # the usage chunk has choices == []
                    continue
                choice = choices[0]
                yield from _delta_events(choice.get("delta"), splitter, now)
                if choice.get("finish_reason"):
                    finish = str(choice["finish_reason"])
                if self.aborted:
                    break
        except StreamFailure as exc:
            yield StreamError(exc.kind, exc.message, time.monotonic(), exc.status_code)
            return
        now = time.monotonic()
        yield from _split_events(splitter.flush(), now)
        if self.aborted:
            yield StreamError("aborted", "stopped by the user", now)
        elif finish is None:
            yield StreamError("broken", "the engine closed the stream before the answer finished", now)
        else:
            yield Finished(finish, now)


def _delta_events(delta: object, splitter: ThinkSplitter, now: float) -> Iterator[ChatEvent]:
    if not isinstance(delta, dict):
        return
    # `reasoning` first: servers in the rename window sent both fields with the same text.
    reasoning = delta.get("reasoning")
    if reasoning is None:
        reasoning = delta.get("reasoning_content")
    if reasoning:
        yield ReasoningDelta(str(reasoning), now)
    content = delta.get("content")
    if content:
        yield from _split_events(splitter.feed(str(content)), now)


def _split_events(parts: Sequence[tuple[str, str]], now: float) -> Iterator[ChatEvent]:
    for kind, text in parts:
        if kind == "reclassify":
            yield ReclassifyAsReasoning(now)
        else:
            yield (ReasoningDelta if kind == "reasoning" else ContentDelta)(text, now)
