"""The self-test's view of the engine: streamed generations with token timing, /tokenize, /metrics.

Decode tok/s is taken from the stream after the first token (the first token carries the prefill):
(completion_tokens - 1) / (t_last - t_first), with completion_tokens from the stream's usage chunk,
because one SSE chunk may carry several tokens (docs/simengine.md: catch-up bursts are batched).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import cast

import httpx
import openai
from openai.types.chat import ChatCompletionMessageParam

from app.backend.recipe.schema import Sampling
from app.backend.engine.metrics_text import parse_metrics


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
    """One engine base URL (http://host:port). Close it when done."""

    def __init__(self, base_url: str, model: str, sampling: Sampling | None = None, timeout_s: float = 900.0):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.sampling = sampling
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=5.0))
        self._sdk = openai.OpenAI(base_url=self.base_url + "/v1", api_key="EMPTY", max_retries=0, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()
        self._sdk.close()

    def tokenize(self, messages: list[dict[str, str]]) -> int:
        """Prompt tokens of chat messages, counted by the engine itself (vLLM's POST /tokenize)."""
        resp = self._http.post(self.base_url + "/tokenize", json={"model": self.model, "messages": messages})
        if resp.status_code == 404:
            raise RuntimeError("the engine has no /tokenize route (vLLM serves it by default; is this vLLM?)")
        resp.raise_for_status()
        return int(resp.json()["count"])

    def generation_tokens_total(self) -> float | None:
        """vllm:generation_tokens_total from /metrics (None when unreadable)."""
        try:
            resp = self._http.get(self.base_url + "/metrics", timeout=5.0)
            resp.raise_for_status()
            return parse_metrics(resp.text).first(("vllm:generation_tokens_total", "vllm:generation_tokens"))
        except (httpx.HTTPError, ValueError):
            return None

    def generate(self, messages: list[dict[str, str]], max_tokens: int, *, min_tokens: int = 0,
                 ignore_eos: bool = False, seed: int | None = None, thinking: bool = True,
                 cancel: threading.Event | None = None) -> Timing:
        """Stream one answer with the card's sampling; raises Cancelled when `cancel` is set."""
        extra: dict[str, object] = {"chat_template_kwargs": {"thinking": thinking}}
        if self.sampling is not None:
            extra["min_p"] = self.sampling.min_p
        if min_tokens:
            extra["min_tokens"] = min_tokens
        if ignore_eos:
            extra["ignore_eos"] = True
        t0 = time.monotonic()
        first = last = 0.0
        usage_tokens, prompt_tokens, finish, parts = 0, 0, "", []
        # plain role/content dicts: the SDK's TypedDict union accepts them structurally
        sdk_messages = cast("list[ChatCompletionMessageParam]", messages)
        stream = self._sdk.chat.completions.create(
            model=self.model, messages=sdk_messages, max_tokens=max_tokens, stream=True, seed=seed,
            temperature=self.sampling.temperature if self.sampling else None,
            top_p=self.sampling.top_p if self.sampling else None,
            stream_options={"include_usage": True}, extra_body=extra)
        with stream:
            for chunk in stream:
                if cancel is not None and cancel.is_set():
                    raise Cancelled()
                now = time.monotonic()
                if chunk.usage is not None:
                    usage_tokens, prompt_tokens = chunk.usage.completion_tokens, chunk.usage.prompt_tokens
                for ch in chunk.choices:
                    delta = ch.delta
                    piece = (delta.content or "") + (getattr(delta, "reasoning", None) or "") \
                        + (getattr(delta, "reasoning_content", None) or "")
                    if piece:
                        first = first or now
                        last = now
                        if delta.content:
                            parts.append(delta.content)
                    if ch.finish_reason:
                        finish = ch.finish_reason
        return Timing(ttft_s=(first or time.monotonic()) - t0, decode_s=max(0.0, last - first),
                      completion_tokens=usage_tokens, prompt_tokens=prompt_tokens, text="".join(parts),
                      finish_reason=finish)
