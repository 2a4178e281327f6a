"""OpenAI-compatible request parsing and response shapes of the SIMULATED engine (vLLM 0.2x/0.33 style)."""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from .quality import DECOHERENCE, DEFAULT_NEEDLE_MAX_TOKENS, broken_length, needle_answer
from .textgen import Plan, answer_tokens, count_prompt_tokens, make_plan, reasoning_tokens, request_rng
from .config import REASONING_MODES


class ApiError(Exception):
    """An error answered as vLLM does: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type_: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type_, param

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "seed", "max_tokens", "max_completion_tokens",
                 "repetition_penalty", "presence_penalty", "frequency_penalty", "ignore_eos", "stop", "n", "min_tokens")


@dataclass
class GenRequest:
    """A parsed chat or completion request."""

    kind: str  # "chat" | "completion"
    model: str
    stream: bool
    include_usage: bool
    prompt_text: str
    prompt_tokens: int
    max_tokens: int | None
    ignore_eos: bool
    thinking: bool
    reasoning_mode: str
    params: dict[str, object] = field(default_factory=dict)
    request_id: str = ""
    created: int = 0
    min_tokens: int = 0  # vLLM's min_tokens: EOS is suppressed before this many tokens
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: the counts so far on every chunk


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _number(body: dict[str, object], key: str, lo: float | None = None, hi: float | None = None) -> None:
    v = body.get(key)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ApiError(400, f"{key} must be a number, got {v!r}", param=key)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ApiError(400, f"{key} must be in [{lo}, {hi}], got {v}.", param=key)


def parse_request(kind: str, body: object, served_name: str, model_path: str, max_model_len: int,
                  default_reasoning: str) -> GenRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = body.get("model") or served_name
    if model not in (served_name, model_path):
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    for key, lo, hi in (("temperature", 0, 2), ("top_p", 0, 1), ("min_p", 0, 1), ("max_tokens", 1, None),
                        ("min_tokens", 0, None)):
        _number(body, key, lo, hi)
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", param="messages")
        text, prompt_tokens = chat_prompt(messages)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt else ""
        if not isinstance(prompt, str):
            raise ApiError(400, "prompt must be a string", param="prompt")
        text, prompt_tokens = prompt, count_prompt_tokens(prompt)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    if kind == "completion" and max_tokens is None:
        max_tokens = 16  # vLLM's CompletionRequest default
    # vLLM 0.32's checks, seen in the real-engine tier (docs/real-engine.md): max_tokens above the context is
    # refused, a prompt beyond it too; otherwise max_tokens is cut to what the context leaves (the handler)
    if max_tokens is not None and max_tokens > max_model_len:
        raise ApiError(400, f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. "
                       f"Please request fewer output tokens. (parameter=max_tokens, value={max_tokens}).", param="max_tokens")
    if prompt_tokens > max_model_len:
        raise ApiError(400, f"Input length ({prompt_tokens}) exceeds model's maximum context length ({max_model_len}).")
    ctk = body.get("chat_template_kwargs") or {}
    thinking = kind == "chat" and ctk.get("thinking", ctk.get("enable_thinking", True)) is not False
    mode = body.get("sim_reasoning_mode") or default_reasoning
    if mode not in REASONING_MODES:
        raise ApiError(400, f"sim_reasoning_mode must be one of {', '.join(REASONING_MODES)}", param="sim_reasoning_mode")
    if body.get("include_reasoning") is False:
        mode = "none"
    stream_opts = body.get("stream_options") or {}
    params = {k: body[k] for k in SAMPLING_KEYS if k in body}
    params.update(model=model, stream=bool(body.get("stream")), reasoning_mode=mode)
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    return GenRequest(
        kind=kind, model=model, stream=bool(body.get("stream")), include_usage=bool(stream_opts.get("include_usage")),
        prompt_text=text, prompt_tokens=prompt_tokens, max_tokens=max_tokens, ignore_eos=bool(body.get("ignore_eos")),
        thinking=thinking, reasoning_mode=mode, params=params, request_id=prefix + uuid.uuid4().hex,
        created=int(time.time()), min_tokens=int(body.get("min_tokens") or 0),
        continuous_usage=bool(stream_opts.get("include_usage") and stream_opts.get("continuous_usage_stats")),
    )


def chat_prompt(messages: list[object]) -> tuple[str, int]:
    """The prompt text of chat messages and its token count (the same count /tokenize answers)."""
    text = "\n".join(_content_text(m.get("content")) for m in messages if isinstance(m, dict))
    return text, count_prompt_tokens(text) + 4 * len(messages)


def tokenize(body: object, max_model_len: int) -> dict[str, object]:
    """vLLM's POST /tokenize: {"prompt": str} or {"messages": [...]} -> count, max_model_len, tokens."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    if isinstance(body.get("messages"), list) and body["messages"]:
        _, count = chat_prompt(body["messages"])
    elif isinstance(body.get("prompt"), str):
        count = count_prompt_tokens(body["prompt"])
    else:
        raise ApiError(400, "give either prompt (a string) or messages (a non-empty list)", param="prompt")
    return {"count": count, "max_model_len": max_model_len, "tokens": [(i * 7919) % 128000 for i in range(count)],
            "token_strs": None}


def token_source(req: GenRequest, seed: int, tier: int = 0,
                 needle_ok: int = DEFAULT_NEEDLE_MAX_TOKENS, build: str = "") -> tuple[Plan, Iterator[tuple[str, str]]]:
    """Deterministic (kind, text) tokens: reasoning first (~20-40%), then the answer.

    The base answer does not depend on the profile; `tier` (quality.quality_tier) may break it off
    early, and a needle prompt is answered with its code (quality.needle_answer)."""
    key = json.dumps([req.kind, req.prompt_text, req.params.get("seed"), req.params.get("temperature")])
    rng = request_rng(seed, key)
    plan = make_plan(rng, req.thinking)
    found = needle_answer(req.prompt_text, req.prompt_tokens, needle_ok)
    if found is not None:
        words = found.split()
        plan = Plan(natural_tokens=len(words), reasoning_tokens=0)
        return plan, _needle_gen(words, rng)
    cut = broken_length(request_rng(seed, key + f"\x00tier{tier}"), tier, plan.natural_tokens, build)
    tail = DECOHERENCE.split()
    if cut is not None:
        cut = max(cut, plan.reasoning_tokens + len(tail) + 1)
        plan = Plan(natural_tokens=cut, reasoning_tokens=plan.reasoning_tokens)

    def gen() -> Iterator[tuple[str, str]]:
        reasoning = reasoning_tokens(rng)
        for _ in range(plan.reasoning_tokens):
            yield "reasoning", next(reasoning)
        answer = answer_tokens(rng)
        if cut is not None:
            for _ in range(cut - plan.reasoning_tokens - len(tail)):
                yield "content", next(answer)
            for w in tail:
                yield "content", " " + w
        for tok in answer:
            yield "content", tok

    return plan, gen()


def _needle_gen(words: list[str], rng: random.Random) -> Iterator[tuple[str, str]]:
    for i, w in enumerate(words):
        yield "content", w if i == 0 else " " + w
    yield from (("content", t) for t in answer_tokens(rng, "\n\n"))


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


class DeltaBuilder:
    """Turns (kind, text) tokens into chat deltas for the request's reasoning mode."""

    def __init__(self, mode: str):
        self.mode = mode
        self.in_think = False

    def delta(self, kind: str, text: str) -> dict[str, str]:
        if kind == "reasoning":
            if self.mode == "reasoning":
                return {"reasoning": text}
            if self.mode == "reasoning_content":
                return {"reasoning_content": text}
            if self.mode == "think_tags":
                prefix = "" if self.in_think else "<think>"
                self.in_think = True
                return {"content": prefix + text}
            return {}
        if self.in_think:
            self.in_think = False
            return {"content": "</think>" + ("\n\n" + text.lstrip(" "))}
        return {"content": text}


def merge_deltas(deltas: list[dict[str, str]]) -> list[dict[str, str]]:
    """Merge consecutive deltas with the same keys (catch-up bursts become one SSE chunk)."""
    out: list[dict[str, str]] = []
    for d in deltas:
        if not d:
            continue
        if out and out[-1].keys() == d.keys():
            k = next(iter(d))
            out[-1][k] += d[k]
        else:
            out.append(dict(d))
    return out


def chat_chunk(req: GenRequest, delta: dict[str, str], finish: str | None = None) -> dict[str, object]:
    return {"id": req.request_id, "object": "chat.completion.chunk", "created": req.created, "model": req.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                         "stop_reason": None}]}


def completion_chunk(req: GenRequest, text: str, finish: str | None = None) -> dict[str, object]:
    return {"id": req.request_id, "object": "text_completion", "created": req.created, "model": req.model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}]}


def usage_chunk(req: GenRequest, completion_tokens: int) -> dict[str, object]:
    obj = "chat.completion.chunk" if req.kind == "chat" else "text_completion"
    return {"id": req.request_id, "object": obj, "created": req.created, "model": req.model, "choices": [],
            "usage": usage(req.prompt_tokens, completion_tokens)}


def full_response(req: GenRequest, tokens: list[tuple[str, str]], finish: str) -> dict[str, object]:
    n = len(tokens)
    if req.kind == "completion":
        text = "".join(t for _, t in tokens)
        choice: dict[str, object] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                                  "stop_reason": None}
        return {"id": req.request_id, "object": "text_completion", "created": req.created, "model": req.model,
                "choices": [choice], "usage": usage(req.prompt_tokens, n)}
    builder = DeltaBuilder(req.reasoning_mode)
    texts: dict[str, str] = {"content": ""}
    for d in (builder.delta(k, t) for k, t in tokens):
        for key, val in d.items():
            texts[key] = texts.get(key, "") + val
    if builder.in_think:
        texts["content"] += "</think>"
    message: dict[str, object] = {"role": "assistant", **texts, "tool_calls": []}
    if req.reasoning_mode == "reasoning":
        message.setdefault("reasoning", None)
    return {"id": req.request_id, "object": "chat.completion", "created": req.created, "model": req.model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                         "stop_reason": None}],
            "usage": usage(req.prompt_tokens, n), "prompt_logprobs": None}
