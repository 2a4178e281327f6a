"""The gateway's ASGI app: keys, an allow-list of routes, bounds, usage and activity, in front of the
engine's OpenAI-compatible API on loopback (docs/gateway.md).

A plain ASGI callable (run by uvicorn) rather than a framework router: every request takes the same
short path — allow-list, key, limits, engine readiness, body checks — and a stream is copied event by
event as it arrives (never buffered), over kept-alive connections to the engine (`upstream.UpstreamPool`).
A client that hangs up cancels the copy, which closes the upstream connection: the engine aborts the request.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from app.backend.contracts import Receive, Scope, Send
from app.backend.gateway.keys import DEFAULT_SCOPE, ActivityRecord, KeyStore
from app.backend.gateway.readiness import EngineStatusSource
from app.backend.gateway.upstream import UpstreamError, UpstreamPool, UpstreamResponse


# The routes a client of the card's model needs (docs/gateway.md#routes): the model list and the two
# generation APIs. Everything else vLLM serves — /pause, /abort_requests, /update_weights, /tokenize,
# /metrics, /invocations, /v1/responses, /v1/embeddings… — is 404 here.
ROUTES: dict[str, str] = {
    "/v1/models": "GET",
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
}
GENERATION = frozenset({"/v1/chat/completions", "/v1/completions"})


@dataclass(frozen=True)
class Limits:
    max_concurrent: int = 8  # requests in flight per key
    rate_per_min: float = 120.0  # requests per minute per key (token bucket, burst = max_concurrent * 2)
    max_body_bytes: int = 8 * 1024 * 1024  # a 256K-token prompt is ~1 MB of text; 8 MiB leaves room
    body_timeout_s: float = 30.0  # a client must send its whole body within this (slow-client bound)
    header_timeout_s: float = 10.0  # ... and a request's headers within this (server.header_deadline_protocol)
    max_connections: int = 2048  # connections and requests at once, all keys together
    upstream_connect_s: float = 5.0
    capture_bodies: bool = False  # activity keeps bodies only when asked (docs/gateway.md#activity)
    capture_cap_bytes: int = 4096


@dataclass
class _Bucket:
    tokens: float
    stamp: float
    in_flight: int = 0


@dataclass
class _Trace:
    """What one request's copy saw: tokens from the engine's usage, first-token time."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    first_token: float | None = None
    done: bool = False  # the whole answer went to the client ([DONE] or the last byte)
    streamed: bool = False
    captured: bytearray = field(default_factory=bytearray)


class _ClientGone(Exception):
    pass


def _error_body(status: int, message: str, kind: str) -> bytes:
    # OpenAI's error shape, so the SDKs raise their typed errors with our message
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


class GatewayApp:
    def __init__(self, keys: KeyStore, engine: EngineStatusSource, limits: Limits = Limits(),
                 on_event: Callable[[ActivityRecord], None] | None = None):
        self.keys = keys
        self.engine = engine
        self.limits = limits
        self._buckets: dict[str, _Bucket] = {}
        self._upstream: UpstreamPool | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._on_event = on_event

    # -- lifespan ----------------------------------------------------------------------------------
    async def startup(self) -> None:
        # one pool to the engine; no read timeout (a long answer streams for minutes), no proxies (loopback)
        self._upstream = UpstreamPool(connect_timeout_s=self.limits.upstream_connect_s)
        await self.engine.start()
        self._flusher = asyncio.create_task(self._flush_loop())

    async def shutdown(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        await self.engine.stop()
        if self._upstream is not None:
            await self._upstream.aclose()
        await asyncio.to_thread(self.keys.flush)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await asyncio.to_thread(self.keys.flush)
            except Exception:  # a locked or full disk must not stop the gateway; the next flush retries
                pass

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: not served
        await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- helpers -----------------------------------------------------------------------------------
    @staticmethod
    async def _reply(send: Send, status: int, message: str, kind: str,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
        body = _error_body(status, message, kind)
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            *(headers or [])]})
        await send({"type": "http.response.body", "body": body})

    def _admit(self, name: str) -> float | None:
        """Take a rate token and a concurrency slot for `name`; None when admitted, else Retry-After s."""
        lim = self.limits
        now = time.monotonic()
        burst = max(1.0, float(lim.max_concurrent * 2))
        b = self._buckets.get(name)
        if b is None:
            b = self._buckets[name] = _Bucket(tokens=burst, stamp=now)
        rate_s = lim.rate_per_min / 60.0
        b.tokens = min(burst, b.tokens + (now - b.stamp) * rate_s)
        b.stamp = now
        if b.in_flight >= lim.max_concurrent:
            return 1.0
        if b.tokens < 1.0:
            return (1.0 - b.tokens) / rate_s if rate_s > 0 else 60.0
        b.tokens -= 1.0
        b.in_flight += 1
        return None

    def _release(self, name: str) -> None:
        b = self._buckets.get(name)
        if b is not None:
            b.in_flight = max(0, b.in_flight - 1)

    async def _read_body(self, receive: Receive) -> bytes:
        """The whole request body, or raise: too big (413), too slow (408), client gone."""
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.limits.body_timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            msg = await asyncio.wait_for(receive(), timeout=left)
            if msg["type"] == "http.disconnect":
                raise _ClientGone
            part = msg.get("body", b"")
            size += len(part)
            if size > self.limits.max_body_bytes:
                raise OverflowError
            chunks.append(part)
            if not msg.get("more_body", False):
                return b"".join(chunks)

    # -- the request path ---------------------------------------------------------------------------
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        allowed = ROUTES.get(path)
        if allowed is None:
            await self._reply(send, 404, f"{path!r} is not served by this gateway (it forwards "
                              f"{', '.join(ROUTES)} only; docs/gateway.md)", "not_found")
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        auth = headers.get("authorization", b"").decode("latin-1")
        scheme, _, key = auth.partition(" ")
        rec = self.keys.authenticate(key.strip(), DEFAULT_SCOPE) if scheme.lower() == "bearer" else None
        if rec is None:
            why = ("no API key: send `Authorization: Bearer <key>` (create one with `moet-panel keys create NAME`)"
                   if not auth else "the API key is not valid (unknown, expired or revoked)")
            await self._reply(send, 401, why, "authentication_error", [(b"www-authenticate", b"Bearer")])
            return
        if method != allowed:
            await self._reply(send, 405, f"{path} accepts {allowed} only", "invalid_request_error",
                              [(b"allow", allowed.encode())])
            return
        wait = self._admit(rec.name)
        if wait is not None:
            await self._reply(send, 429, f"too many requests for key {rec.name!r} (at most {self.limits.max_concurrent} "
                              f"at once, {self.limits.rate_per_min:g} a minute); retry after {math.ceil(wait)} s",
                              "rate_limit_error", [(b"retry-after", str(max(1, math.ceil(wait))).encode())])
            return
        started = time.monotonic()
        wall = time.time()
        status = 500
        trace = _Trace()
        error = ""
        req_capture: str | None = None
        try:
            status, error, req_capture = await self._forward(scope, receive, send, path, method, headers, trace)
        except _ClientGone:
            status, error = 499, "client disconnected"
        finally:
            self._release(rec.name)
            duration = time.monotonic() - started
            tok_s = None
            if trace.completion_tokens and trace.first_token is not None:
                # decode rate after the first token on a stream; the whole answer's rate otherwise
                span = time.monotonic() - (trace.first_token if trace.streamed else started)
                tok_s = trace.completion_tokens / span if span > 0 else None
            cap = self.limits.capture_cap_bytes
            event = ActivityRecord(
                time=wall, key_name=rec.name, route=f"{method} {path}", status=status,
                prompt_tokens=trace.prompt_tokens, completion_tokens=trace.completion_tokens,
                ttft_s=(trace.first_token - started) if trace.first_token is not None else None,
                duration_s=duration, tok_s=tok_s, error=error,
                request_body=req_capture if self.limits.capture_bodies else None,
                response_body=bytes(trace.captured[:cap]).decode("utf-8", "replace") if self.limits.capture_bodies else None)
            self.keys.record(event, error=status >= 400)
            if self._on_event is not None:
                self._on_event(event)

    async def _forward(self, scope: Scope, receive: Receive, send: Send, path: str, method: str,
                       headers: dict[str, bytes], trace: _Trace) -> tuple[int, str, str | None]:
        """Check the body, ask the engine, copy its answer. Returns (status, error, captured request)."""
        engine = self.engine.status()
        body = b""
        strip_usage = False
        captured: str | None = None
        if method == "POST":
            ctype = headers.get("content-type", b"").split(b";")[0].strip().lower()
            try:
                body = await self._read_body(receive)
            except OverflowError:
                await self._reply(send, 413, f"request body over {self.limits.max_body_bytes} bytes", "invalid_request_error",
                                  [(b"connection", b"close")])
                return 413, "body too large", None
            except (TimeoutError, asyncio.TimeoutError):
                await self._reply(send, 408, f"the request body did not arrive within {self.limits.body_timeout_s:g} s",
                                  "invalid_request_error", [(b"connection", b"close")])
                return 408, "body too slow", None
            if ctype != b"application/json":
                await self._reply(send, 415, "send the body as JSON with `Content-Type: application/json`",
                                  "invalid_request_error")
                return 415, "wrong content type", None
            try:
                text = body.decode("utf-8")
                payload = json.loads(text)
            except UnicodeDecodeError:
                await self._reply(send, 400, "the request body is not UTF-8", "invalid_request_error")
                return 400, "body not UTF-8", None
            except ValueError as exc:
                await self._reply(send, 400, f"the request body is not valid JSON ({exc})", "invalid_request_error")
                return 400, "malformed JSON", None
            if not isinstance(payload, dict):
                await self._reply(send, 400, "the request body must be a JSON object", "invalid_request_error")
                return 400, "body not an object", None
            if self.limits.capture_bodies:
                captured = text[: self.limits.capture_cap_bytes]
            if payload.get("stream") is True:
                opts = payload.get("stream_options")
                if not isinstance(opts, dict) or not opts.get("include_usage"):
                    # ask the engine to count the tokens; the usage chunk is kept from this client
                    payload["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
                    strip_usage = True
                    body = json.dumps(payload).encode()
        if not engine.ready:
            await self._reply(send, 503, f"the model is not available: {engine.reason}", "service_unavailable",
                              [(b"retry-after", b"10")])
            return 503, f"engine not ready: {engine.state}", captured
        assert self._upstream is not None
        fwd_headers = {"content-type": "application/json", "accept": headers.get("accept", b"*/*").decode("latin-1")}
        try:
            resp = await self._upstream.request(engine.base_url, method, path, fwd_headers,
                                                body if method == "POST" else b"")
        except UpstreamError as exc:
            await self._reply(send, 502, f"the engine did not answer ({exc}); it may be restarting",
                              "service_unavailable", [(b"retry-after", b"10")])
            return 502, "upstream: no answer", captured
        try:
            status = resp.status_code
            streaming = resp.headers.get("content-type", "").startswith("text/event-stream")
            out_headers = [(b"content-type", resp.headers.get("content-type", "application/json").encode("latin-1"))]
            if streaming:
                out_headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
            await send({"type": "http.response.start", "status": status, "headers": out_headers})
            trace.streamed = streaming
            if streaming:
                await self._watched(self._pump(resp, send, trace, strip_usage), receive, trace)
            else:
                await self._watched(self._whole(resp, send, trace), receive, trace)
            return status, "" if status < 400 else f"engine answered {status}", captured
        finally:
            resp.close()

    @staticmethod
    def _usage_from(data: bytes, trace: _Trace) -> None:
        try:
            usage = json.loads(data).get("usage") or {}
        except (ValueError, AttributeError):
            return
        if isinstance(usage, dict):
            trace.prompt_tokens = usage.get("prompt_tokens")
            trace.completion_tokens = usage.get("completion_tokens")

    async def _whole(self, resp: UpstreamResponse, send: Send, trace: _Trace) -> None:
        data = await resp.read()
        trace.first_token = time.monotonic()
        self._usage_from(data, trace)
        if self.limits.capture_bodies:
            trace.captured += data[: self.limits.capture_cap_bytes]
        trace.done = True
        await send({"type": "http.response.body", "body": data})

    @staticmethod
    async def _watched(work: Awaitable[None], receive: Receive, trace: _Trace) -> None:
        """Run `work` (the copy of the engine's answer) while watching for the client hanging up; a hang-up
        cancels it, and the caller's `resp.close()` then closes the engine connection (the engine aborts)."""
        pump = asyncio.ensure_future(work)

        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    pump.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            await pump
        except asyncio.CancelledError:
            if watcher.done():  # the client left: close upstream (the caller's finally), record it
                if trace.done:  # ... after it had the whole answer: a normal end
                    return
                raise _ClientGone from None
            raise
        finally:
            watcher.cancel()

    async def _pump(self, resp: UpstreamResponse, send: Send, trace: _Trace, strip_usage: bool) -> None:
        buf = b""
        cap = self.limits.capture_cap_bytes if self.limits.capture_bodies else 0
        async for chunk in resp.chunks():
            buf += chunk
            if b"\n\n" not in buf:
                continue
            *events, buf = buf.split(b"\n\n")
            out: list[bytes] = []
            for ev in events:
                if ev.startswith(b"data: {") and (trace.first_token is None or b'"usage"' in ev):
                    keep = self._inspect(ev[6:], trace, strip_usage)
                    if not keep:
                        continue
                elif ev.startswith(b"data: [DONE]"):
                    trace.done = True
                out.append(ev + b"\n\n")
            if out:
                data = b"".join(out)
                if cap and len(trace.captured) < cap:
                    trace.captured += data[: cap - len(trace.captured)]
                await send({"type": "http.response.body", "body": data, "more_body": True})
        trace.done = True
        await send({"type": "http.response.body", "body": buf, "more_body": False})

    @staticmethod
    def _inspect(data: bytes, trace: _Trace, strip_usage: bool) -> bool:
        """Read a chunk that mentions usage; False when it is the usage-only chunk to keep from the client."""
        try:
            obj = json.loads(data)
        except ValueError:
            return True
        if not isinstance(obj, dict):
            return True
        usage = obj.get("usage")
        choices = obj.get("choices")
        if trace.first_token is None and isinstance(choices, list) and choices and isinstance(choices[0], dict):
            # the first token: text in the delta (content or reasoning) or a completion's text; vLLM's first
            # chunk carries only the role
            c0 = choices[0]
            raw_delta = c0.get("delta")
            delta: dict[str, object] = raw_delta if isinstance(raw_delta, dict) else {}
            if c0.get("text") or any(delta.get(k) for k in ("content", "reasoning", "reasoning_content", "tool_calls")):
                trace.first_token = time.monotonic()
        if isinstance(usage, dict):
            trace.prompt_tokens = usage.get("prompt_tokens", trace.prompt_tokens)
            trace.completion_tokens = usage.get("completion_tokens", trace.completion_tokens)
            if strip_usage and not choices:
                return False
        return True
