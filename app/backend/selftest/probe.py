"""The self-test's view of the engine: streamed generations with token timing, /tokenize, /metrics.

Decode tok/s is taken from the stream after the first token (the first token carries the prefill):
(completion_tokens - 1) / (t_last - t_first), with completion_tokens from the stream's usage chunk,
because one SSE chunk may carry several tokens (docs/simengine.md: catch-up bursts are batched).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


import httpx

from app.backend.engine.runtime.client import engine_client
from app.backend.recipe.schema import Sampling
from app.backend.engine.runtime.metrics_text import parse_metrics


class Cancelled(Exception):
    """The user cancelled the self-test (or the A/B run)."""


@dataclass(frozen=True)
class Timing:
    """One streamed generation, timed at the client."""

    ttft_s: float
    decode_s: float  # first token -> last token
    completion_tokens: int
    prompt_tokens: int
    text: str
    finish_reason: str

    @property
    def decode_tok_s(self) -> float | None:
        if self.completion_tokens < 2 or self.decode_s <= 0:
            return None
        return (self.completion_tokens - 1) / self.decode_s


class EngineProbe:
    """The self-test's and the A/B run's reads of one engine base URL (http://host:port), through the shared
    engine client (engine/runtime/client.py)."""

    def __init__(self, base_url: str, model: str, sampling: Sampling | None = None):
        self._client = engine_client(base_url)
        self.base_url = self._client.base_url
        self.model = model
        self.sampling = sampling

    def tokenize(self, messages: list[dict[str, str]]) -> int:
        """Prompt tokens of chat messages, counted by the engine itself (vLLM's POST /tokenize)."""
        return self._client.tokenize(self.model, messages)

    def generation_tokens_total(self) -> float | None:
        """vllm:generation_tokens_total from /metrics (None when unreadable)."""
        try:
            text = self._client.metrics().text
            return parse_metrics(text).first(("vllm:generation_tokens_total", "vllm:generation_tokens"))
        except (httpx.HTTPError, ValueError):
            return None

    def generate(self, messages: list[dict[str, str]], max_tokens: int, *, min_tokens: int = 0,
                 ignore_eos: bool = False, seed: int | None = None, thinking: bool = True,
                 cancel: threading.Event | None = None) -> Timing:
        """Stream one answer with the card's sampling; raises Cancelled when `cancel` is set, StreamFailure when
        the engine fails."""
        body: dict[str, object] = {"model": self.model, "messages": messages, "max_tokens": max_tokens,
                                "chat_template_kwargs": {"thinking": thinking}}
        if self.sampling is not None:
            body.update(temperature=self.sampling.temperature, top_p=self.sampling.top_p, min_p=self.sampling.min_p)
        if seed is not None:
            body["seed"] = seed
        if min_tokens:
            body["min_tokens"] = min_tokens
        if ignore_eos:
            body["ignore_eos"] = True
        stream = self._client.stream_chat(body)  # before t0: the first call builds the SDK client
        t0 = time.monotonic()
        first = last = 0.0
        usage_tokens, prompt_tokens, finish, parts = 0, 0, "", []
        with stream:
            for chunk in stream:
                if cancel is not None and cancel.is_set():
                    raise Cancelled()
                now = time.monotonic()
                usage = chunk.get("usage")
                if usage:
                    usage_tokens = int(usage.get("completion_tokens") or 0)
                    prompt_tokens = int(usage.get("prompt_tokens") or 0)
                for ch in chunk.get("choices") or ():
                    delta = ch.get("delta") or {}
                    content = delta.get("content") or ""
                    piece = content + (delta.get("reasoning") or "") + (delta.get("reasoning_content") or "")
                    if piece:
                        first = first or now
                        last = now
                        if content:
                            parts.append(content)
                    if ch.get("finish_reason"):
                        finish = str(ch["finish_reason"])
        return Timing(ttft_s=(first or time.monotonic()) - t0, decode_s=max(0.0, last - first),
                      completion_tokens=usage_tokens, prompt_tokens=prompt_tokens, text="".join(parts),
                      finish_reason=finish)
