"""A request body's checks before it reaches the engine (docs/gateway.md "Bounds and errors"): an announced
length within the limit, JSON, finite numbers, an object, bounded nesting, `stream` a boolean, `max_tokens` within
the cap, `n`, `best_of`, `min_tokens` and the logprobs fields within bounds; and the usage the gateway asks the
engine for. Every refusal is a `Refused` the proxy answers in OpenAI's error shape, counted by its reason."""

from __future__ import annotations

import json
import math

from app.backend.gateway.assemble import WHOLE

# One sequence a request: the fair queue and the engine's slots count a request as one sequence, and the card's
# engine runs one (`--max-num-seqs 1`); `n: 5` would hold five (issue 48). docs/gateway.md#bounds-and-errors
MAX_N = 1
# logprobs / top_logprobs / prompt_logprobs: a few alternatives a token; vLLM reads -1 as the whole vocabulary
MAX_LOGPROBS = 5
LOGPROB_FIELDS = ("logprobs", "top_logprobs", "prompt_logprobs")
# what a stream does not carry as a non-streaming answer does (the prompt's logprobs, the best of several, the
# prompt echoed): such a request goes to the engine as asked (docs/gateway.md "Usage")
WHOLE_ONLY = ("prompt_logprobs", "best_of", "echo")


class Refused(Exception):
    """A refusal found in the checks: (status, message, kind, reason, headers)."""

    def __init__(self, status: int, message: str, kind: str, reason: str,
                 headers: list[tuple[bytes, bytes]] | None = None, error: str = ""):
        super().__init__(message)
        self.status, self.message, self.kind, self.reason = status, message, kind, reason
        self.headers = headers or []
        self.error = error or reason.replace("_", " ")


def too_deep(obj: object, limit: int) -> bool:
    """Arrays and objects nested deeper than `limit` (walked without recursion)."""
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            if d > limit:
                return True
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            if d > limit:
                return True
            stack.extend((v, d + 1) for v in o)
    return False


def check_length(headers: dict[str, bytes], max_body_bytes: int) -> None:
    """A body announced (Content-Length) over the limit: 413 at once, before a byte of it is read (it held a
    keyed connection until the 30 s body deadline, issue 48)."""
    length = headers.get("content-length", b"").strip()
    if length.isdigit() and int(length) > max_body_bytes:
        raise Refused(413, f"request body over {max_body_bytes} bytes (announced: {int(length)} bytes), this "
                      "gateway's limit (--max-body-mb)", "invalid_request_error", "body_too_large", [(b"connection", b"close")],
                      "body too large")


class _NonFinite(ValueError):
    pass


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses as inf
        raise _NonFinite(text)
    return value


def _no_constant(name: str) -> float:
    raise _NonFinite(name)  # the NaN, Infinity and -Infinity literals Python's parser would accept


def _loads(text: str) -> object:
    """JSON with finite numbers only; raises Refused (400) for NaN, Infinity or an overflowing number."""
    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except _NonFinite as exc:
        raise Refused(400, f"the request body has a non-finite number ({str(exc)[:20]}): every number must be "
                      "finite", "invalid_request_error", "non_finite_number", error="non-finite number") from None


def _bounded(payload: dict[str, object], name: str, low: int, high: int, why: str) -> None:
    """`name`, when given, is an integer within [low, high]; else a 400 counted as `out_of_bounds`."""
    v = payload.get(name)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
        shown = json.dumps(v)[:40]
        allowed = f"{low}" if low == high else f"an integer from {low} to {high}"
        raise Refused(400, f"`{name}` must be {allowed}, not {shown}: {why}",
                      "invalid_request_error", "out_of_bounds", error=f"{name} out of bounds")


def check_fields(payload: dict[str, object], max_tokens: int) -> None:
    """`n`, `best_of`, `min_tokens` and the logprobs fields within bounds (`max_tokens`: the most this request may
    generate, asked or the cap); raises Refused."""
    for name in ("n", "best_of"):
        _bounded(payload, name, 1, MAX_N, f"this gateway's engine serves {MAX_N} sequence a request "
                 "(docs/gateway.md#bounds-and-errors)")
    _bounded(payload, "min_tokens", 0, max_tokens, f"at most `max_tokens` ({max_tokens})")
    for name in LOGPROB_FIELDS:
        if name == "logprobs" and isinstance(payload.get(name), bool):
            continue  # chat's `logprobs: true` (the count is top_logprobs)
        _bounded(payload, name, 0, MAX_LOGPROBS, f"at most {MAX_LOGPROBS} alternatives a token")


def check_json(body: bytes, ctype: bytes, *, max_depth: int, max_tokens: int,
               context_tokens: int, whole_as_stream: bool = False) -> tuple[bytes, str, str]:
    """(the body to send, the usage the gateway asked for to keep from the client — "" none, "chunks" the usage on
    every chunk, "all" that and the usage-only chunk, "whole" a non-streaming request sent as a stream when
    `whole_as_stream` (assemble.py) —, the body's text); raises Refused."""
    if ctype != b"application/json":
        raise Refused(415, "send the body as JSON with `Content-Type: application/json`", "invalid_request_error",
                      "bad_request", error="wrong content type")
    try:
        text = body.decode("utf-8")
        payload = _loads(text)
    except UnicodeDecodeError:
        raise Refused(400, "the request body is not UTF-8", "invalid_request_error", "bad_request",
                      error="body not UTF-8") from None
    except RecursionError:  # nesting deeper than the parser's stack: refused, never a traceback
        raise Refused(400, f"the request body's JSON is nested deeper than {max_depth} levels",
                      "invalid_request_error", "bad_request", error="JSON too deep") from None
    except ValueError as exc:
        raise Refused(400, f"the request body is not valid JSON ({exc})", "invalid_request_error", "bad_request",
                      error="malformed JSON") from None
    if not isinstance(payload, dict):
        raise Refused(400, "the request body must be a JSON object", "invalid_request_error", "bad_request",
                      error="body not an object")
    if too_deep(payload, max_depth):
        raise Refused(400, f"the request body's JSON is nested deeper than {max_depth} levels",
                      "invalid_request_error", "bad_request", error="JSON too deep")
    stream = payload.get("stream")
    if stream is not None and not isinstance(stream, bool):
        # "true" as a string was streamed by the engine but not counted here (issue 40)
        raise Refused(400, f"`stream` must be a JSON boolean (true or false), not {json.dumps(stream)[:40]}",
                      "invalid_request_error", "bad_request", error="stream not a boolean")
    changed = False
    asked = [f for f in ("max_tokens", "max_completion_tokens") if payload.get(f) is not None]
    for f in asked:
        v = payload[f]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise Refused(400, f"`{f}` must be a positive integer", "invalid_request_error", "bad_request",
                          error=f"{f} not a positive integer")
        if v > max_tokens:
            raise Refused(400, f"`{f}` {v} is over this gateway's cap of {max_tokens} tokens a request; ask "
                          f"for at most {max_tokens} (docs/gateway.md#caps)", "invalid_request_error",
                          "bad_request", error=f"{f} over the cap")
    check_fields(payload, min((payload[f] for f in asked), default=max_tokens))
    if not asked and max_tokens < context_tokens:
        payload["max_tokens"] = max_tokens  # no limit asked: the cap, not the rest of the context
        changed = True
    strip_usage = ""
    if stream is True:
        opts = payload.get("stream_options")
        opts = opts if isinstance(opts, dict) else {}
        if not opts.get("include_usage") or not opts.get("continuous_usage_stats"):
            # ask the engine for its counts on every chunk (the bill of a stream whatever its client does,
            # docs/gateway.md "Usage"); what this client did not ask for is kept from it
            strip_usage = "chunks" if opts.get("include_usage") else "all"
            payload["stream_options"] = {**opts, "include_usage": True, "continuous_usage_stats": True}
            changed = True
    elif whole_as_stream and payload.get("stream_options") is None and not any(
            payload.get(f) for f in WHOLE_ONLY):
        # a non-streaming request goes to the engine as a stream with its counts on every chunk, joined back into
        # one answer by the gateway: a client that hangs up is billed what the engine did (docs/gateway.md "Usage")
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        strip_usage, changed = WHOLE, True
    if changed:
        body = json.dumps(payload).encode()
    return body, strip_usage, text
