"""Typed events of one streamed chat completion (what the client yields, what a turn consumes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class ReasoningDelta:
    """A piece of the model's chain of thought (delta.reasoning, reasoning_content or <think> text)."""

    text: str
    t: float  # time.monotonic() when the chunk arrived


@dataclass(frozen=True)
class ContentDelta:
    """A piece of the answer."""

    text: str
    t: float


@dataclass(frozen=True)
class ReclassifyAsReasoning:
    """Everything streamed as answer so far was thinking (a `</think>` arrived with no `<think>`:
    the chat template opened the tag in the prompt)."""

    t: float


@dataclass(frozen=True)
class UsageReport:
    """The final usage chunk (`stream_options.include_usage`): choices == [], usage set."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    t: float


@dataclass(frozen=True)
class Finished:
    """The server ended the stream normally; `reason` is the choice's finish_reason (stop/length/...)."""

    reason: str | None
    t: float


@dataclass(frozen=True)
class StreamError:
    """The stream failed. `kind`: connect (nothing listening), http (server said no), broken (died
    mid-stream), timeout, aborted (we closed it on purpose)."""

    kind: str
    message: str
    t: float
    status_code: int | None = None


ChatEvent = Union[ReasoningDelta, ContentDelta, ReclassifyAsReasoning, UsageReport, Finished, StreamError]
