"""Per-reply measurements (TTFT, decode rate, tokens, wall time) and the one-line stats text."""

from __future__ import annotations

from dataclasses import dataclass

from app.backend.chat.events import ChatEvent, ContentDelta, ReasoningDelta, ReclassifyAsReasoning, UsageReport
from app.backend.chat.models import MessageStats


@dataclass
class StatsRecorder:
    """Feed every event of one stream; `finish()` turns the clock readings into MessageStats."""

    started: float  # time.monotonic() just before the request was sent
    first_token: float | None = None
    last_token: float | None = None
    first_reasoning: float | None = None
    first_content: float | None = None
    deltas: int = 0  # SSE deltas with text: ≈ tokens when the server sends no usage chunk
    usage: UsageReport | None = None

    def observe(self, event: ChatEvent) -> None:
        if isinstance(event, (ReasoningDelta, ContentDelta)):
            if self.first_token is None:
                self.first_token = event.t
            self.last_token = event.t
            self.deltas += 1
            if isinstance(event, ReasoningDelta) and self.first_reasoning is None:
                self.first_reasoning = event.t
            if isinstance(event, ContentDelta) and self.first_content is None:
                self.first_content = event.t
        elif isinstance(event, ReclassifyAsReasoning):
            if self.first_reasoning is None:
                self.first_reasoning = self.first_content
            self.first_content = None
        elif isinstance(event, UsageReport):
            self.usage = event

    def reasoning_seconds(self, now: float) -> float | None:
        """Thinking time: first reasoning token -> first answer token (or now / end)."""
        if self.first_reasoning is None:
            return None
        end = self.first_content if self.first_content is not None else now
        return max(0.0, end - self.first_reasoning)

    def completion_tokens(self) -> tuple[int, bool]:
        if self.usage is not None and self.usage.completion_tokens:
            return self.usage.completion_tokens, False
        return self.deltas, True

    def live_rate(self, now: float) -> float | None:
        if self.first_token is None or now - self.first_token < 0.2:
            return None
        return self.deltas / (now - self.first_token)

    def finish(self, end: float, base: MessageStats) -> MessageStats:
        tokens, estimated = self.completion_tokens()
        rate = None
        if self.first_token is not None and self.last_token is not None and self.last_token > self.first_token:
            # n tokens span n-1 decode steps between the first and the last one
            rate = (tokens - 1) / (self.last_token - self.first_token)
        base.ttft_s = None if self.first_token is None else self.first_token - self.started
        base.decode_tok_s = rate
        base.prompt_tokens = self.usage.prompt_tokens if self.usage else None
        base.completion_tokens = tokens if (tokens or self.usage) else None
        base.tokens_estimated = estimated and tokens > 0
        base.wall_s = end - self.started
        return base


def format_stats(stats: MessageStats) -> str:
    """'profile quality · build pin · TTFT 0.21 s · 48.7 tok/s · 35→812 tokens · 17.1 s · SIMULATED'."""
    parts = [f"profile {stats.profile_id or 'unknown'}"]
    if stats.build:  # which engine build answered (docs/engine.md "Upgrading the engine")
        parts.append(f"build {stats.build}")
    if stats.ttft_s is not None:
        parts.append(f"TTFT {stats.ttft_s:.2f} s")
    if stats.decode_tok_s is not None:
        parts.append(f"{stats.decode_tok_s:.1f} tok/s")
    approx = "~" if stats.tokens_estimated else ""
    completion = "?" if stats.completion_tokens is None else f"{approx}{stats.completion_tokens}"
    if stats.prompt_tokens is None:  # no usage chunk (stopped, broken, or a server without it)
        parts.append(f"{completion} tokens out")
    else:
        parts.append(f"{stats.prompt_tokens}→{completion} tokens")
    if stats.wall_s is not None:
        parts.append(f"{stats.wall_s:.1f} s")
    if stats.finish_reason == "length":
        parts.append("hit max tokens")
    if stats.simulated:
        parts.append("SIMULATED")
    return " · ".join(parts)
