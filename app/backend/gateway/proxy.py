"""The gateway's ASGI app: keys, an allow-list of routes, bounds, a fair queue, usage and activity, in front of
the engine's OpenAI-compatible API on loopback (docs/gateway.md).

A plain ASGI callable (run by uvicorn) rather than a framework router: every request takes the same
short path — allow-list, key, limits, body checks, engine readiness, the fair queue — over kept-alive connections
to the engine (`upstream.UpstreamPool`). The engine's answer is read at the engine's speed into memory and written
to the client at the client's (`delivery.py`): the engine's sequence and the queue's slot are freed when the engine
finishes, not when a slow reader has read the last byte (issue 48/50); a stream's events still go out as they come.
From the moment the body is read, the client's hang-up (ASGI `http.disconnect`) is watched: it cancels the
work wherever it is — waiting in the queue, waiting for the engine's headers (a non-streaming answer sends them
last), copying — and the engine's connection is half-closed, so the engine aborts the request and what it had
sent is still read for its counts (issue 40, issue 48 "usage = what the engine did").
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from app.backend import oplog
from app.backend.contracts import Receive, Scope, Send
from app.backend.gateway.assemble import WHOLE, WholeAnswer
from app.backend.gateway.caps import GatewayCaps
from app.backend.gateway.connguard import ConnGuard
from app.backend.gateway.delivery import Answer, ClientProgress, answer_bound
from app.backend.gateway.fairqueue import FairQueue, QueueFull, work
from app.backend.gateway.routing import Chooser, LeastBusy, Target
from app.backend.gateway.gwmetrics import REPORT_S, GatewayMetrics, RefusalLog
from app.backend.gateway.inputs import Refused, check_json, check_length
from app.backend.gateway import fleetside
from app.backend.gateway.keys import DEFAULT_SCOPE, FLEET_SCOPE, ActivityRecord, KeyRecord, KeyStore
from app.backend.gateway.engine_status import EngineStatus, EngineStatusSource
from app.backend.gateway.upstream import BodyNeverBegan, UpstreamError, UpstreamPool, UpstreamResponse

# The routes a client of the card's model needs (docs/gateway.md#routes): the model list and the two
# generation APIs. Everything else vLLM serves — /pause, /abort_requests, /update_weights, /tokenize,
# /metrics, /invocations, /v1/responses, /v1/embeddings… — is 404 here.
ROUTES: dict[str, str] = {
    "/v1/models": "GET",
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
}
GENERATION = frozenset({"/v1/chat/completions", "/v1/completions"})
NO_KEY = "(no key)"  # the activity's key column for refusals before a key was known
UNKNOWN_KEY = "(unknown key)"
TICK_S = 0.25  # revocations, stalls and reports are checked this often
GPU_HEADER = b"x-moet-panel-gpu"  # on a box of several GPUs: the GPU whose engine answered (docs/gateway.md)
DEFAULT_MAX_TOKENS = 4096  # a request's max_tokens cap: ~84 s of the card's 48.9 tok/s decode (docs/gateway.md#caps)
DRAIN_S = 2.0  # after a hang-up or a cut: how long the engine's last bytes (its counts) are read for
_USAGE = re.compile(rb',"usage":(\{(?:[^{}]|\{[^{}]*\})*\}|null)')  # vLLM's compact JSON: one nesting level
_PROMPT = re.compile(rb'"prompt_tokens":(\d+)')
_COMPLETION = re.compile(rb'"completion_tokens":(\d+)')
_ASKED = re.compile(rb'"max(?:_completion)?_tokens":\s*(\d+)')
_PROTOCOL_STATUS = {"too_many_connections": 429, "header_too_large": 431, "header_timeout": 408,
                    "evicted_idle": 429}  # refused before any request reached us


@dataclass(frozen=True)
class Limits:
    max_concurrent: int = 8  # requests in flight per key
    rate_per_min: float = 120.0  # requests per minute per key (token bucket, burst = max_concurrent * 2)
    max_body_bytes: int = 8 * 1024 * 1024  # a 256K-token prompt is ~1 MB of text; 8 MiB leaves room
    body_timeout_s: float = 30.0  # a client must send its whole body within this (slow-client bound)
    header_timeout_s: float = 10.0  # ... and a request's headers within this (server.header_deadline_protocol)
    first_header_timeout_s: float = 3.0  # a connection that has shown no valid key: its first request's headers
    max_connections: int = 2048  # connections and requests at once, all sources together
    max_conn_per_source: int = 128  # connections from one address (IPv6: one /64), connguard.py
    upstream_connect_s: float = 5.0
    capture_bodies: bool = False  # activity keeps bodies only when asked (docs/gateway.md#activity)
    capture_cap_bytes: int = 4096
    max_tokens: int = DEFAULT_MAX_TOKENS  # max_tokens / max_completion_tokens of one request (above: 400); a key's own wins
    context_tokens: int = 262144  # the engine's context; a lower max_tokens cap is also sent when a request has none
    engine_slots: int = 256  # requests at the engine at once (its --max-num-seqs); more wait in the fair queue
    max_queue: int = 512  # requests waiting for a slot, all keys (beyond: 429)
    stall_s: float = 30.0  # a client that acknowledges nothing of its answer for this long is cut (499)
    max_hold_s: float = 120.0  # a key's time on engine sequences while another key waits; beyond, its request is ended
    max_json_depth: int = 64  # nesting of a request body's JSON (deeper: 400)


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
    streamed: bool = False  # the client's answer is a stream
    sse: bool = False  # the engine's answer is a stream (also a non-streaming request's: assemble.py)
    started: bool = False  # http.response.start sent
    events: int = 0  # SSE data events copied (about one token each: the bill when an engine sends no usage)
    usage_seen: bool = False  # the engine's own counts came (every chunk carries them: continuous_usage_stats)
    captured: bytearray = field(default_factory=bytearray)
    gpu: int | None = None  # the GPU whose engine answered (a box of several; None: the one engine)


@dataclass
class _Running:
    """A request past its checks: what the tick needs to end it (key revoked, client stalled)."""

    key_hash: str
    key_name: str = ""
    task: asyncio.Future[Any] | None = None
    cut: str = ""  # why the gateway ended it: "revoked", "stalled", "gone" (the client hung up), "ended" (its front)
    sending_since: float = 0.0  # a send to the client began at this time and has not returned (0: none)
    progress: ClientProgress | None = None  # the client's acknowledged bytes (delivery.py); None: not measured
    in_flight: bool = False  # counted in the answers in flight (a drain waits for them) until the engine is done
    engine_since: float = 0.0  # on an engine's sequence since (0: not on one)
    resp: UpstreamResponse | None = None  # the engine's answer being read
    key_released: bool = False  # the key's concurrency slot given back (_release_key)
    held: bool = False  # ended at the engine by the hold cap (Limits.max_hold_s): the answer ends with a 429
    request_id: str = ""  # a fleet's request: the front's id of it (fleetside.REQUEST_HEADER), the same on each copy
    ended_by_front: bool = False  # a box: ended at the engine as its front asked (fleetside.END_PATH)


class _ClientGone(Exception):
    pass


def _error_body(status: int, message: str, kind: str) -> bytes:
    # OpenAI's error shape, so the SDKs raise their typed errors with our message
    return json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()


def retry_after(engine: EngineStatus) -> list[tuple[bytes, bytes]]:
    """Retry-After from when the engine is expected back; none when unknown (a fixed guess made the openai
    SDK's retries hang a client 20 s for an engine that was stopped, issue 39)."""
    if engine.retry_after_s > 0:
        return [(b"retry-after", str(max(1, math.ceil(engine.retry_after_s))).encode())]
    return []


class GatewayApp:
    def __init__(self, keys: KeyStore, engine: EngineStatusSource, limits: Limits = Limits(),
                 on_event: Callable[[ActivityRecord], None] | None = None,
                 report: Callable[[dict[str, object]], None] | None = None):
        self.keys = keys
        self.engine = engine
        self.limits = limits
        self._buckets: dict[str, _Bucket] = {}
        self._upstream: UpstreamPool | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._on_event = on_event
        self._report = report
        self.queue = FairQueue(limits.engine_slots, limits.max_queue)
        self.chooser: Chooser = LeastBusy()  # which engine of the box takes a request (routing.py)
        self.metrics = GatewayMetrics()
        self.guard: ConnGuard | None = None  # set by the server: marks a connection that showed a valid key
        self._running: dict[int, _Running] = {}
        self._held_s: dict[str, float] = {}  # key -> its time on sequences while another key waited (the hold cap)
        self._ticked = time.monotonic()
        self._refusals = RefusalLog()
        self._reported_at = 0.0
        self.who = oplog.PANEL  # who started it, for the operator's log (the CLI sets its own)
        # a fleet's front (docs/fleet.md): headers sent upstream with every request (the fleet key, for the router
        # to forward to the boxes), and the model list answered here (the router's fails while a box is down)
        self.upstream_headers: dict[str, str] = {}
        self.models_answer: Callable[[], bytes] | None = None
        self.upstream_idle_s = 0.0  # a front: a stream whose box went silent this long ends with an error event
        self.upstream_first_s = 0.0  # ... and before its first byte (0: the same bound)
        self.upstream_first_per_byte_s = 0.0  # ... plus this per byte of the request: a long prompt's prefill
        # a front: an event set when a box is lost (cut off, frozen); requests still waiting for their answer's
        # headers are then sent again (nothing reached their client; the router no longer lists that box)
        self.box_lost: Callable[[], asyncio.Event] | None = None
        # a front: asks the boxes to end a request at their engine by its id and send the rest (fleetside.END_PATH);
        # a hang-up that closed the router's connection never reached the engine's last counts (docs/fleet.md)
        self.end_upstream: Callable[[str], Awaitable[int]] | None = None
        self._side_tasks: set[asyncio.Future[None]] = set()

    def apply_caps(self, caps: GatewayCaps) -> None:
        """The owner's caps, changed on the Access tab while this gateway serves (caps.py): the next request is
        checked against them; answers running keep going (their max_tokens was checked when they came). Called on
        the status pipe's thread: one attribute swap, read whole by each use. The panel logged the decision, with
        who asked (switch.GatewayService.set_caps)."""
        self.limits = replace(self.limits, max_tokens=caps.max_tokens, max_hold_s=caps.max_hold_s)

    # -- lifespan ----------------------------------------------------------------------------------
    async def startup(self) -> None:
        # one pool to the engine; no read timeout (a long answer streams for minutes), no proxies (loopback)
        self._upstream = UpstreamPool(connect_timeout_s=self.limits.upstream_connect_s)
        await self.engine.start()
        self._flusher = asyncio.create_task(self._flush_loop())
        self._ticker = asyncio.create_task(self._tick_loop())
        oplog.decision("gateway", "started", who=self.who, slots=self.limits.engine_slots,
                       max_tokens=self.limits.max_tokens, per_source=self.limits.max_conn_per_source)

    async def shutdown(self) -> None:
        for task in (self._flusher, self._ticker):
            if task is not None:
                task.cancel()
        await self.engine.stop()
        if self._upstream is not None:
            await self._upstream.aclose()
        await asyncio.to_thread(self.keys.flush)
        self._report_metrics()
        oplog.decision("gateway", "stopped", who=self.who, refusals=sum(self.metrics.refusals.values()))

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await asyncio.to_thread(self.keys.flush)
            except Exception as exc:  # a locked or full disk must not stop the gateway; the next flush retries
                oplog.caught("gateway", exc, "writing usage and activity")

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.tick()
            except Exception as exc:  # a bug here must not stop the revocation and stall checks for good
                oplog.caught("gateway", exc, "the gateway's tick", traceback=True)

    def tick(self) -> None:
        """Revoked keys' requests and stalled clients are cut, a key over the hold cap is ended at the engine;
        figures reported; refusals summed up."""
        now = time.monotonic()
        dt, self._ticked = now - self._ticked, now
        for run in list(self._running.values()):
            if run.task is None or run.task.done() or run.cut:
                continue
            if not self.keys.still_active(run.key_hash):
                run.cut = "revoked"
                run.task.cancel()
                continue
            idle = run.progress.check(now) if run.progress is not None and run.progress.measured else (
                now - run.sending_since if run.sending_since else 0.0)
            if idle > self.limits.stall_s:
                run.cut = "stalled"
                oplog.decision("gateway", "cut", who=oplog.key(run.key_name), why="stalled",
                               idle_s=round(idle, 1), stall_s=self.limits.stall_s)
                run.task.cancel()
        self._hold_cap(dt)
        if now - self._reported_at >= REPORT_S:
            self._report_metrics()
        counts = self._refusals.due()
        if counts:
            oplog.decision("gateway", "refused", who=oplog.OUTSIDE, window_s=int(self._refusals.log_every),
                           **{f"n_{k}": v for k, v in sorted(counts.items())})
        if self._refusals.suppressed:
            n, self._refusals.suppressed = self._refusals.suppressed, 0
            self.keys.record(ActivityRecord(time=time.time(), key_name="(refused)", route="-", status=429,
                                            error=f"{n} more refused attempts not listed one by one (a flood)"),
                             error=False)

    def _hold_cap(self, dt: float) -> None:
        """A key's time on engine sequences while another key waits is capped (Limits.max_hold_s): beyond it, its
        oldest request on a sequence is ended at the engine (the answer so far goes to its client, then a 429
        error) and the sequence goes to the next key's turn. The count starts again when the key holds none."""
        on: dict[str, list[_Running]] = {}
        for run in self._running.values():
            if run.engine_since and not run.held and not run.cut:
                on.setdefault(run.key_hash, []).append(run)
        for k in [k for k in self._held_s if k not in on]:
            del self._held_s[k]
        waiting = self.queue.waiting_keys()
        for key, runs in on.items():
            if not waiting - {key}:
                continue
            held = self._held_s[key] = self._held_s.get(key, 0.0) + dt * len(runs)
            if held > self.limits.max_hold_s:
                oldest = min(runs, key=lambda r: r.engine_since)
                oldest.held = True
                self._held_s[key] = 0.0
                oplog.decision("gateway", "cut", who=oplog.key(oldest.key_name), why="held_the_engine",
                               held_s=round(held, 1), max_hold_s=self.limits.max_hold_s, waiting=len(self.queue))
                if oldest.resp is not None and oldest.resp.headers.get("content-type", "").startswith("text/event-stream"):
                    if self.end_upstream is not None and oldest.request_id:  # a front: its box ends it (_end_held)
                        task = asyncio.ensure_future(self._end_held(oldest, oldest.resp))
                        self._side_tasks.add(task)  # held until done (the loop keeps only a weak reference)
                        task.add_done_callback(self._side_tasks.discard)
                    else:
                        oldest.resp.hang_up()  # the engine aborts; its last bytes and counts are still read
                elif oldest.task is not None:  # no stream to end with an error event: the request ends with a 429
                    oldest.cut = "held"
                    oldest.task.cancel()

    def _report_metrics(self) -> None:
        self._reported_at = time.monotonic()
        self.metrics.queue_length = len(self.queue)
        if self._report is not None:
            self._report({"metrics": self.metrics.as_json()})

    def _in_flight(self, delta: int) -> None:
        self.metrics.in_flight += delta
        if self._report is not None:  # at once: a drain waits for this count to reach 0
            self._report({"in_flight": self.metrics.in_flight})

    def answers_in_flight(self) -> int:
        return self.metrics.in_flight

    def _began(self, target: Target) -> None:
        self.chooser.began(target)
        self._report_gpus(target)

    def _ended(self, target: Target) -> None:
        self.chooser.ended(target)
        self._report_gpus(target)

    def _report_gpus(self, target: Target) -> None:
        """The panel's child tells the panel its answers per GPU (each engine's drain waits for its own)."""
        if self._report is not None and target.gpu is not None:
            box = self.engine.status()
            self._report({"in_flight_gpu": {str(e.gpu): self.chooser.in_flight(e.gpu) for e in box.engines}})

    def answers_in_flight_on(self, gpu: int) -> int:
        """Answers running on that GPU's engine (a box of several: that engine's drain waits for these)."""
        return self.chooser.in_flight(gpu)

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
                    oplog.caught("gateway", exc, "starting the gateway", traceback=True)
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

    @staticmethod
    async def _json(send: Send, status: int, body: bytes) -> None:
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def note_refusal(self, reason: str, status: int = 0, route: str = "-", key_name: str | None = None,
                     error: str = "") -> None:
        """A refused attempt: counted by reason, in the key's errors when a key is known, and in the activity
        at a bounded rate. Also the connection guard's and the header cap's hook (no request reached the app)."""
        self.metrics.refused(reason)
        if key_name is not None:
            self.metrics.request(key_name, status)
        if self._refusals.take(reason):
            name = key_name or (UNKNOWN_KEY if reason == "bad_key" else NO_KEY)
            status = status or _PROTOCOL_STATUS.get(reason, 400)
            self.keys.record(ActivityRecord(time=time.time(), key_name=name, route=route, status=status,
                                            error=error or reason.replace("_", " ")), error=True)
        elif key_name is not None:  # the key's error count stays exact; only the listing is sampled
            self.keys.count_error(key_name)

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

    def _identify(self, auth: str, fleet_member: bool = False) -> tuple[KeyRecord | None, str, str]:
        """(the active key, refusal reason, message) from an Authorization header. A fleet's box (it holds a
        fleet key: fleetside.py) accepts that scope alone."""
        scheme, _, key = auth.partition(" ")
        key = key.strip()
        scope = FLEET_SCOPE if fleet_member else DEFAULT_SCOPE
        rec = self.keys.authenticate(key, scope) if scheme.lower() == "bearer" else None
        if rec is not None:
            return rec, "", ""
        if fleet_member and auth:
            return None, "bad_key", ("this box serves its fleet's front only: send requests to the front's address "
                                     "with your key there (docs/fleet.md)")
        if not auth:
            return None, "no_key", ("no API key: send `Authorization: Bearer <key>` (create one with `moet-panel "
                                    "keys create NAME`)")
        known = self.keys.identify(key) if scheme.lower() == "bearer" else None
        if known is not None and known.scope == scope:
            return known, "revoked_key", f"the API key {known.name!r} is {known.status()}"
        return None, "bad_key", "the API key is not valid (unknown, expired or revoked)"

    # -- the request path ---------------------------------------------------------------------------
    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        member = self.keys.fleet_member()  # a fleet's box: the front's key alone, and the health check
        if member and path == fleetside.HEALTH_PATH and method == "GET":
            code, data = fleetside.health(self.engine.status())
            await self._json(send, code, data)
            return
        allowed = ROUTES.get(path) or (fleetside.MEMBER_ROUTES.get(path) if member else None)
        close = [(b"connection", b"close")]  # a refused stranger's connection ends with the answer
        if allowed is None:
            self.metrics.refused("not_found")
            await self._reply(send, 404, f"{path!r} is not served by this gateway (it forwards "
                              f"{', '.join(ROUTES)} only; docs/gateway.md)", "not_found", close)
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope["headers"]}
        auth = headers.get("authorization", b"").decode("latin-1")
        rec, why, message = self._identify(auth, member)
        route = f"{method} {path}"
        if why:
            self.note_refusal(why, 401, route, rec.name if rec is not None else None)
            await self._reply(send, 401, message, "authentication_error", [(b"www-authenticate", b"Bearer"), *close])
            return
        assert rec is not None
        if self.guard is not None:
            self.guard.authenticated(scope.get("client"))
        if method != allowed:
            self.note_refusal("wrong_method", 405, route, rec.name)
            await self._reply(send, 405, f"{path} accepts {allowed} only", "invalid_request_error",
                              [(b"allow", allowed.encode())])
            return
        if path == fleetside.STATUS_PATH:
            await self._json(send, 200, fleetside.status_body(self.engine.status(), self.metrics.in_flight))
            return
        if path == fleetside.END_PATH:
            ended = self._end_for_front(fleetside.request_id(headers))
            await self._json(send, 200, json.dumps({"ended": ended}).encode())
            return
        if path == "/v1/models" and self.models_answer is not None:
            await self._json(send, 200, self.models_answer())
            return
        wait = self._admit(rec.name)
        if wait is not None:
            self.note_refusal("rate_limited", 429, route, rec.name)
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
        run = _Running(rec.hash, rec.name, request_id=fleetside.request_id(headers) if member else "")
        cap = min(rec.max_tokens or self.limits.max_tokens, self.limits.context_tokens)  # the key's own, or ours
        refused = False
        try:
            try:
                body, strip_usage, req_capture = await self._checked_body(receive, method, headers, cap)
                if member and strip_usage != WHOLE:
                    strip_usage = ""  # the front's stream: the engine's counts on every chunk (fleetside.py)
                engine = self.engine.status()
                if engine.slots and engine.slots != self.queue.slots:  # the profile running now
                    self.queue.resize(engine.slots)
                if not engine.accepts:
                    raise Refused(503, f"the model is not available: {engine.reason}", "service_unavailable",
                                  "not_ready", retry_after(engine), f"engine not ready: {engine.state}")
            except Refused as r:
                self.note_refusal(r.reason, r.status, route, rec.name, r.error)
                status, error, refused = r.status, r.error, True
                await self._reply(send, r.status, r.message, r.kind, r.headers)
                return
            self._in_flight(+1)
            run.in_flight = True  # until the engine is done with it (_off_engine)
            now = self.engine.status()
            if not now.accepts:  # a drain began between the check and the count: it may not have seen this one
                self.note_refusal("not_ready", 503, route, rec.name, f"engine not ready: {now.state}")
                status, error, refused = 503, f"engine not ready: {now.state}", True
                await self._reply(send, 503, f"the model is not available: {now.reason}", "service_unavailable",
                                  retry_after(now))
                return
            self._running[id(run)] = run
            if self.guard is not None:
                conn = self.guard.connection(scope.get("client"))
                if conn is not None:
                    run.progress = ClientProgress(conn.transport, time.monotonic())
            status, error = await self._guarded(
                self._forward(send, path, method, headers, body, strip_usage, engine, trace, run, cap), receive, send,
                trace, run)
        except _ClientGone:
            status, error = 499, "client disconnected"
        finally:
            self._running.pop(id(run), None)
            self._off_engine(run)
            self._release_key(run)
            if not refused:  # a refusal is counted and listed by note_refusal
                self._finish(rec.name, route, wall, started, status, error, trace, req_capture)

    def _finish(self, name: str, route: str, wall: float, started: float, status: int, error: str, trace: _Trace,
                req_capture: str | None) -> None:
        duration = time.monotonic() - started
        tok_s = None
        if not trace.usage_seen and trace.sse and trace.events and not trace.done:
            # an engine that sent no counts (no continuous_usage_stats): bill what was sent (about a token an
            # event; the first chat event carries only the role)
            trace.completion_tokens = max(0, trace.events - (1 if route.endswith("chat/completions") else 0))
        if trace.completion_tokens and trace.first_token is not None:
            # decode rate after the first token on a stream; the whole answer's rate otherwise
            span = time.monotonic() - (trace.first_token if trace.streamed else started)
            tok_s = trace.completion_tokens / span if span > 0 else None
        cap = self.limits.capture_cap_bytes
        ttft = (trace.first_token - started) if trace.first_token is not None else None
        event = ActivityRecord(
            time=wall, key_name=name, route=route, status=status,
            prompt_tokens=trace.prompt_tokens, completion_tokens=trace.completion_tokens,
            ttft_s=ttft, duration_s=duration, tok_s=tok_s, error=error,
            request_body=req_capture if self.limits.capture_bodies else None,
            response_body=bytes(trace.captured[:cap]).decode("utf-8", "replace") if self.limits.capture_bodies else None)
        self.metrics.request(name, status)
        self.metrics.billed(name, trace.prompt_tokens, trace.completion_tokens)  # the usage's tokens, in /metrics too
        self.keys.record(event, error=status >= 400)
        self.metrics.duration.observe(duration)
        if ttft is not None:
            self.metrics.ttft.observe(ttft)
        if self._on_event is not None:
            self._on_event(event)

    async def _checked_body(self, receive: Receive, method: str, headers: dict[str, bytes],
                            cap: int) -> tuple[bytes, str, str | None]:
        """The body, read and checked against the key's `max_tokens` cap: (body to send, usage to keep from the
        client, captured text). Raises Refused."""
        if method != "POST":
            return b"", "", None
        lim = self.limits
        ctype = headers.get("content-type", b"").split(b";")[0].strip().lower()
        check_length(headers, lim.max_body_bytes)  # an announced body over the limit: 413 before reading it
        try:
            body = await self._read_body(receive)
        except OverflowError:
            raise Refused(413, f"request body over {lim.max_body_bytes} bytes", "invalid_request_error",
                          "body_too_large", [(b"connection", b"close")], "body too large") from None
        except (TimeoutError, asyncio.TimeoutError):
            raise Refused(408, f"the request body did not arrive within {lim.body_timeout_s:g} s",
                          "invalid_request_error", "bad_request", [(b"connection", b"close")], "body too slow") from None
        # a fleet's front too: its boxes send it the engine's counts on every chunk (docs/fleet.md "Usage")
        body, strip_usage, text = check_json(body, ctype, max_depth=lim.max_json_depth, max_tokens=cap,
                                             context_tokens=lim.context_tokens, whole_as_stream=True)
        return body, strip_usage, text[: lim.capture_cap_bytes] if lim.capture_bodies else None

    async def _guarded(self, work: Coroutine[Any, Any, tuple[int, str]], receive: Receive, send: Send,
                       trace: _Trace, run: _Running) -> tuple[int, str]:
        """Run `work` (queue, engine, copy) while watching for the client hanging up, from the first moment:
        a hang-up, a revoked key or a stalled reader cancels it wherever it waits, and the upstream connection
        closes (the engine aborts the request). Returns (status, error)."""
        task: asyncio.Future[tuple[int, str]] = asyncio.ensure_future(work)
        run.task = task

        async def watch() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    if not task.done() and not trace.done:
                        run.cut = run.cut or "gone"
                        task.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        try:
            return await task
        except asyncio.CancelledError:
            if not task.cancelled() or not run.cut:
                raise  # the server is stopping: not ours to answer
            if trace.done and run.cut != "stalled":
                return 200, ""
            if run.cut == "gone":
                raise _ClientGone from None
            return await self._after_cut(run, trace, send)
        finally:
            watcher.cancel()

    async def _after_cut(self, run: _Running, trace: _Trace, send: Send) -> tuple[int, str]:
        """The gateway ended the request: a revoked key's client is told so (a JSON error, or an error event on
        its stream); a stalled client gets nothing more, and its connection is reset (what the kernel still held
        for it is dropped, not sent)."""
        if run.cut == "ended":  # a box: its front's client left before any answer; a 4xx, which the router passes on
            if not trace.started:  # (a 5xx it would send to another box)
                await self._reply(send, 499, "ended at the front's request: its client left", "client_closed")
            return 499, "ended at the front's request (its client left)"
        if run.cut == "held":
            if not trace.started:
                await self._reply(send, 429, self._held_message(), "rate_limit_error", [(b"retry-after", b"5")])
            return 429, "held the engine too long while others waited"
        if run.cut != "revoked":
            if run.progress is not None:
                run.progress.reset()
            return 499, "client stopped reading"
        message = "the API key was revoked while this request ran"
        if not trace.started:
            await self._reply(send, 401, message, "authentication_error", [(b"connection", b"close")])
        elif trace.streamed:
            event = b"data: " + _error_body(401, message, "authentication_error") + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        return 401, "key revoked while answering"

    async def _forward(self, send: Send, path: str, method: str, headers: dict[str, bytes], body: bytes,
                       strip_usage: str, engine: EngineStatus, trace: _Trace, run: _Running,
                       cap: int) -> tuple[int, str]:
        """Wait for an engine slot in turn (generation only: the model list takes no sequence), ask the engine,
        read its answer; the slot is released when the ENGINE is done, then the rest goes to the client from
        memory. Returns (status, error)."""
        if path not in GENERATION:
            status, error, rest = await self._ask(send, path, method, headers, body, strip_usage, engine, trace, run,
                                                  cap)
            self._off_engine(run)
            return await self._rest(status, error, rest)
        key = self._key_of(run)
        asked = _ASKED.search(body)
        cost = work(len(body) / 4, min(int(asked.group(1)), cap) if asked else cap)  # ~4 bytes of JSON a token
        try:
            waited = await self.queue.acquire(key, cost)
        except QueueFull:
            msg = (f"the engine is busy: {len(self.queue)} requests are waiting (the most this gateway queues); "
                   "retry in a few seconds")
            self.metrics.refused("queue_full")  # listed in the activity by the caller, as the key's error
            await self._reply(send, 429, msg, "rate_limit_error", [(b"retry-after", b"5")])
            return 429, "queue full"
        self.metrics.queue_wait.observe(waited)
        try:
            status, error, rest = await self._ask(send, path, method, headers, body, strip_usage, engine, trace, run,
                                                  cap)
        finally:
            self._off_engine(run)
            if trace.prompt_tokens is not None or trace.completion_tokens is not None:  # before the next turn is chosen
                self.queue.settle(key, cost, work(trace.prompt_tokens or 0, trace.completion_tokens or 0))
            self.queue.release()
        return await self._rest(status, error, rest)

    def _off_engine(self, run: _Running) -> None:
        """The engine is done with this request (finished, cut, or never reached): it no longer counts in flight
        (a drain waits for these, docs/gateway.md#drain); what is left is memory going to a client."""
        run.engine_since = 0.0
        run.resp = None
        if run.in_flight:
            run.in_flight = False
            self._in_flight(-1)

    @staticmethod
    async def _rest(status: int, error: str, rest: asyncio.Future[None] | None) -> tuple[int, str]:
        if rest is not None:
            await rest  # the answer's rest, from memory to the client (cancelled with this task)
        return status, error

    async def _ask(self, send: Send, path: str, method: str, headers: dict[str, bytes], body: bytes,
                   strip_usage: str, engine: EngineStatus, trace: _Trace, run: _Running,
                   cap: int) -> tuple[int, str, asyncio.Future[None] | None]:
        """Ask an engine (the chooser's, from the box's status now: the queue may have waited) and read its
        answer; returns once the engine is done: (status, error, the delivery of what is left to the client). On
        a box of several, an engine that does not answer at all or answers 503 (it is stopping; nothing was sent
        to the client yet) is tried no more for this request: the next accepting one is, so a GPU leaving
        mid-switch refuses nobody."""
        assert self._upstream is not None
        fwd_headers = {"content-type": "application/json",
                       "accept": headers.get("accept", b"*/*").decode("latin-1"), **self.upstream_headers}
        if self.end_upstream is not None:  # a front: the id its boxes know this request by (fleetside.END_PATH)
            run.request_id = run.request_id or uuid.uuid4().hex
            fwd_headers[fleetside.REQUEST_HEADER] = run.request_id
        tried: list[str] = []
        while True:
            box = self.engine.status()
            target = self.chooser.pick(box, tried)
            if target is None:
                why = box.reason or "no engine accepts requests now"
                await self._reply(send, 503, f"the model is not available: {why}", "service_unavailable",
                                  retry_after(box))
                return 503, f"engine not ready: {box.state}", None
            self._began(target)
            run.engine_since = time.monotonic()  # a non-streaming answer's headers come only at its end
            try:
                resp = await self._request(target.base_url, method, path, fwd_headers,
                                           body if method == "POST" else b"", trace, run)
            except UpstreamError as exc:
                self._ended(target)
                tried.append(target.base_url)
                if box.engines and self.chooser.pick(self.engine.status(), tried) is not None:
                    continue  # another GPU serves: it takes the request
                oplog.caught("gateway", exc, "forwarding a request to the engine", route=f"{method} {path}")
                await self._reply(send, 502, f"the engine did not answer ({exc}); it may be restarting",
                                  "service_unavailable", retry_after(self.engine.status()))
                return 502, "upstream: no answer", None
            except BaseException:
                self._ended(target)
                raise
            if resp.status_code == 503 and box.engines:  # that engine is stopping: it ran nothing of this request
                tried.append(target.base_url)
                if self.chooser.pick(self.engine.status(), tried) is not None:
                    resp.close()
                    self._ended(target)
                    continue
            break
        trace.gpu = target.gpu
        run.resp = resp
        status = resp.status_code
        trace.sse = resp.headers.get("content-type", "").startswith("text/event-stream")
        # a non-streaming request sent as a stream (assemble.py); an error status comes as JSON, passed through
        whole = strip_usage == WHOLE and trace.sse and status == 200
        streaming = trace.streamed = trace.sse and not whole
        writer: asyncio.Future[None] | None = None
        try:
            if streaming:
                answer = Answer(answer_bound(cap))
                await self._start(resp, send, trace, True)
                writer = asyncio.ensure_future(self._deliver(answer, send, trace, run))
                silent = await self._read_stream(resp, answer, trace, strip_usage, run)
                rest: asyncio.Future[None] = writer
                if silent:  # a fleet's box went silent mid-answer: the client gets an error event, not a hang
                    return 502, silent, rest
            else:
                if whole:
                    status, data = await self._read_assembled(resp, trace, run, path == "/v1/chat/completions")
                else:
                    data = await self._read_whole(resp, trace, run)
                rest = asyncio.ensure_future(self._whole(resp, data, send, trace, run, status))
        except BaseException:
            if writer is not None:
                writer.cancel()
            await self._drain(resp, trace, run)  # the client left or was cut: the engine aborts; read its counts
            raise
        finally:
            resp.close()
            self._ended(target)
        if run.held and not streaming:
            rest.cancel()  # not started: nothing was sent
            await self._reply(send, 429, self._held_message(), "rate_limit_error", [(b"retry-after", b"5")])
            return 429, "held the engine too long while others waited", None
        if run.held:
            return 429, "held the engine too long while others waited", rest
        if run.ended_by_front:
            return 499, "ended at the front's request (its client left)", rest
        return status, "" if status < 400 else f"engine answered {status}", rest

    def _held_message(self) -> str:
        return (f"this key held the engine over {self.limits.max_hold_s:g} s while others waited; the answer was "
                "ended there (docs/gateway.md#caps)")

    async def _drain(self, resp: UpstreamResponse, trace: _Trace, run: _Running) -> None:
        """After a hang-up or a cut: half-close the engine's connection (the engine sees its client gone and aborts
        the request) and read what it had already sent, for a while, for its counts (continuous usage). A fleet's
        front asks its boxes to end the request instead (`_end_upstream`): the router would drop the rest."""
        if not trace.sse:
            return  # a non-streaming answer carries its counts only at its end: nothing to read
        if self.end_upstream is None or not run.request_id:
            resp.hang_up()
        else:
            await self._end_upstream(run.request_id)
        await self._read_counts(resp, trace)

    async def _read_counts(self, resp: UpstreamResponse, trace: _Trace) -> None:
        """What the upstream still sends, for DRAIN_S at most, read for its counts only."""
        async def counts() -> None:
            buf = b""
            async for chunk in resp.chunks():
                buf += chunk
                *events, buf = buf.split(b"\n\n")
                for ev in events:
                    self._count(ev, trace)
                    if ev.startswith(b"data: [DONE]"):
                        return  # a front: nothing of use follows (docs/fleet.md#faults)

        try:
            await asyncio.wait_for(counts(), DRAIN_S)
        except (UpstreamError, asyncio.TimeoutError):
            pass  # the engine closed mid-answer (as it does on an abort), or took too long to

    async def _left_while_asked(self, asked: asyncio.Future[UpstreamResponse], trace: _Trace, run: _Running) -> None:
        """A front whose client left before its answer's first bytes (a long prefill): the boxes end the request,
        and what the box then sends (the prompt's count, once its prefill ended) is read before the answer is
        dropped; closing at once left the prompt billed to the fleet key on the box, to nobody at the front."""
        if self.end_upstream is None or not run.request_id:
            return
        await self._end_upstream(run.request_id)
        done, _ = await asyncio.wait({asked}, timeout=DRAIN_S)
        if asked in done and not asked.cancelled() and asked.exception() is None:
            resp = asked.result()
            try:
                await self._read_counts(resp, trace)
            finally:
                resp.close()

    async def _end_held(self, run: _Running, resp: UpstreamResponse) -> None:
        """The hold cap on a fleet's front: the box ends the request at its engine and sends the rest, its counts
        included (a half-close through the router lost them: it closes both its connections, docs/fleet.md); a box
        that has not ended it within DRAIN_S is half-closed all the same."""
        await self._end_upstream(run.request_id)
        await asyncio.sleep(DRAIN_S)  # the box's end normally comes within ~0.2 s; this is the fallback's timer
        resp.hang_up()

    async def _end_upstream(self, request_id: str) -> None:
        """A front: the boxes end the request at their engine and send the rest, its counts included (fleetside.py);
        the router's connection stays open meanwhile: closed, it drops what the box sends after (docs/fleet.md)."""
        assert self.end_upstream is not None
        try:
            await self.end_upstream(request_id)
        except Exception as exc:  # a box that does not answer: its engine ends when the connection closes, below
            oplog.caught("gateway", exc, "asking the boxes to end a request")

    def _end_for_front(self, request_id: str) -> int:
        """A box: the front's client left; its requests of that id are ended at the engine, and the rest the engine
        writes goes to the front (a stream) or, before any answer, the request is dropped. Returns how many."""
        ended = 0
        for run in list(self._running.values()):
            if not request_id or run.request_id != request_id or run.cut or run.ended_by_front or run.task is None:
                continue
            ended += 1
            resp = run.resp
            if resp is not None and resp.headers.get("content-type", "").startswith("text/event-stream"):
                run.ended_by_front = True
                resp.hang_up()  # the engine aborts; its last bytes and counts are still read and sent on
            else:  # queued, or a non-streaming answer: nothing went to the front yet; it is told so (_after_cut)
                run.cut = "ended"
                run.task.cancel()
        if ended:
            oplog.decision("gateway", "ended_for_front", who=oplog.PANEL, requests=ended)
        return ended

    @staticmethod
    def _count(ev: bytes, trace: _Trace) -> re.Match[bytes] | None:
        """The engine's cumulative counts on an SSE event (vLLM's continuous_usage_stats); the usage's span."""
        m = _USAGE.search(ev) if ev.startswith(b"data: {") else None
        if m is not None and m.group(1) != b"null":
            p, c = _PROMPT.search(m.group(1)), _COMPLETION.search(m.group(1))
            if p is not None:
                trace.prompt_tokens = int(p.group(1))
            if c is not None:
                trace.completion_tokens = int(c.group(1))
            trace.usage_seen = True
        return m

    async def _request(self, base_url: str, method: str, path: str, headers: dict[str, str],
                       body: bytes, trace: _Trace, run: _Running) -> UpstreamResponse:
        """The upstream's answer headers; on a fleet's front, asked again while nothing reached the client: when a
        box is lost before they came, when the router passes on a 5xx, and when a stream's connection closed
        before its first byte (a box that began to stop in that instant, docs/fleet.md "Faults")."""
        assert self._upstream is not None
        if self.box_lost is None:
            return await self._upstream.request(base_url, method, path, headers, body)
        for attempt in range(8):
            lost = asyncio.ensure_future(self.box_lost().wait())
            asked = asyncio.ensure_future(self._begun(base_url, method, path, headers, body))
            try:
                await asyncio.wait({asked, lost}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                await self._left_while_asked(asked, trace, run)
                raise
            finally:
                lost.cancel()
                if not asked.done():
                    asked.cancel()  # its connection closes: a box still alive aborts the request
            if not asked.done():
                # a task asked to cancel is not cancelled yet: wait for it (reading its result now raised
                # InvalidStateError, a 500 to the client, for every request a lost box held: docs/fleet.md#faults)
                await asyncio.wait({asked})
            if asked.cancelled():
                oplog.decision("gateway", "resent_after_box_lost", who=oplog.PANEL, route=f"{method} {path}")
                continue
            try:
                resp = asked.result()
            except BodyNeverBegan as exc:
                if attempt >= 2:
                    raise
                oplog.decision("gateway", "resent_after_box_closed", who=oplog.PANEL, route=f"{method} {path}",
                               error=str(exc))
                continue
            # the router answers 500 itself for the requests it held on a box taken out of it, and passes on a
            # box's 503 when that box began to drain after the router's last health check (docs/fleet.md
            # "Faults"): sent again, twice at most, as nothing reached the client
            if resp.status_code in (500, 502, 503) and attempt < 2:
                resp.close()
                oplog.decision("gateway", "resent_after_router_error", who=oplog.PANEL, status=resp.status_code,
                               route=f"{method} {path}")
                await asyncio.sleep(0.1)
                continue
            return resp
        raise UpstreamError("the fleet kept losing the boxes this request was sent to")

    async def _begun(self, base_url: str, method: str, path: str, headers: dict[str, str],
                     body: bytes) -> UpstreamResponse:
        """A front's request: its answer's headers and, for a stream, its first bytes; the client is answered
        only from then on, so a box that closes between the two is asked again (`_request`) rather than cut."""
        assert self._upstream is not None
        resp = await self._upstream.request(base_url, method, path, headers, body)
        first = self.upstream_first_s + len(body) * self.upstream_first_per_byte_s if self.upstream_first_s else 0.0
        bound = first or self.upstream_idle_s
        if resp.status_code != 200 or not bound or not resp.headers.get("content-type", "").startswith("text/event-stream"):
            return resp
        try:
            await resp.first_bytes(bound)
        except BaseException:
            resp.close()
            raise
        return resp

    def _key_of(self, run: _Running) -> str:
        return run.key_hash  # the fair queue's turns are per key (its hash: the same for every request of it)

    @staticmethod
    async def _start(resp: UpstreamResponse, send: Send, trace: _Trace, streaming: bool, status: int = 0) -> None:
        ctype = resp.headers.get("content-type", "application/json") if streaming or not trace.sse else "application/json"
        out_headers = [(b"content-type", ctype.encode("latin-1"))]
        if trace.gpu is not None:  # a box of several: which GPU answered (the Chat tab and self-test name it)
            out_headers.append((GPU_HEADER, str(trace.gpu).encode()))
        if streaming:
            out_headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        await send({"type": "http.response.start", "status": status or resp.status_code, "headers": out_headers})
        trace.started = True

    @staticmethod
    def _usage_of(usage: object, trace: _Trace) -> None:
        """The engine's counts so far, from a chunk's parsed usage (continuous_usage_stats)."""
        if isinstance(usage, dict):
            trace.prompt_tokens = usage.get("prompt_tokens", trace.prompt_tokens)
            trace.completion_tokens = usage.get("completion_tokens", trace.completion_tokens)
            trace.usage_seen = True

    @staticmethod
    def _usage_from(data: bytes, trace: _Trace) -> None:
        try:
            usage = json.loads(data).get("usage") or {}
        except (ValueError, AttributeError):
            return
        if isinstance(usage, dict):
            trace.prompt_tokens = usage.get("prompt_tokens")
            trace.completion_tokens = usage.get("completion_tokens")
            trace.usage_seen = True

    async def _read_whole(self, resp: UpstreamResponse, trace: _Trace, run: _Running) -> bytes:
        try:
            data = await resp.read()
        except UpstreamError:
            if not run.held:
                raise
            return b""
        trace.first_token = time.monotonic()
        self._usage_from(data, trace)
        if self.limits.capture_bodies:
            trace.captured += data[: self.limits.capture_cap_bytes]
        return data

    async def _read_assembled(self, resp: UpstreamResponse, trace: _Trace, run: _Running,
                              chat: bool) -> tuple[int, bytes]:
        """A non-streaming request's answer, read from the engine's stream (every chunk's counts read as a
        stream's are, so a hang-up's drain bills what the engine did) and joined into one JSON (assemble.py):
        (its status, its body)."""
        answer = WholeAnswer(chat)
        buf = b""
        done_seen = False
        try:
            async for chunk in resp.chunks(self.upstream_idle_s, self.upstream_first_s):
                buf += chunk
                if b"\n\n" not in buf:
                    continue
                *events, buf = buf.split(b"\n\n")
                for ev in events:
                    done_seen = done_seen or ev.startswith(b"data: [DONE]")
                    if ev.startswith(b"data: {"):
                        trace.events += 1
                        answer.add(ev[6:])
                        self._usage_of(answer.usage, trace)
                if done_seen and self.upstream_idle_s:
                    break  # a fleet's front: [DONE] came, nothing of use follows (docs/fleet.md#faults)
        except UpstreamError as exc:
            if run.held:
                return 429, b""  # ended at the hold cap: the client gets a 429
            if not self.upstream_idle_s:
                raise
            if not done_seen:  # a fleet's box went silent mid-answer (docs/fleet.md#faults)
                return 502, _error_body(502, f"the box answering stopped ({exc}); retry", "api_error")
        if run.held and not done_seen:
            return 429, b""  # a front's box ended it at the hold cap (_end_held): the client gets a 429
        trace.first_token = time.monotonic()
        data = answer.body()
        if self.limits.capture_bodies:
            trace.captured += data[: self.limits.capture_cap_bytes]
        return answer.status(), data

    async def _whole(self, resp: UpstreamResponse, data: bytes, send: Send, trace: _Trace, run: _Running,
                     status: int = 0) -> None:
        await self._start(resp, send, trace, False, status)
        trace.done = True
        run.sending_since = time.monotonic()
        await send({"type": "http.response.body", "body": data})
        run.sending_since = 0.0
        await self._acknowledged(run)

    async def _read_stream(self, resp: UpstreamResponse, answer: Answer, trace: _Trace, strip_usage: str,
                           run: _Running) -> str:
        """The engine's events at the engine's speed into `answer` (usage read, and kept from the client where it
        did not ask for it); the answer ends with the engine's, or with a 429 error event after a hold-cap cut, or
        (a fleet's front) a 502 error event when the box answering went silent: then the error said, else ""."""
        buf = b""
        cap = self.limits.capture_bodies and self.limits.capture_cap_bytes
        done_seen = False
        silent = ""
        try:
            async for chunk in resp.chunks(self.upstream_idle_s, self.upstream_first_s):
                buf += chunk
                if b"\n\n" not in buf:
                    continue
                *events, buf = buf.split(b"\n\n")
                out: list[bytes] = []
                for ev in events:
                    done_seen = done_seen or ev.startswith(b"data: [DONE]")
                    kept = self._event(ev, trace, strip_usage)
                    if kept is not None:
                        out.append(kept + b"\n\n")
                if out:
                    data = b"".join(out)
                    if cap and len(trace.captured) < cap:
                        trace.captured += data[: cap - len(trace.captured)]
                    answer.put(data)
                    if answer.size > answer.limit:
                        await answer.room()  # far past what the cap makes: read the engine as the client reads
                if done_seen and self.upstream_idle_s:
                    break  # a fleet's front: [DONE] came, nothing of use follows (docs/fleet.md#faults)
        except UpstreamError as exc:
            if run.held:
                buf = b""  # ended at the hold cap: its error event below
            elif run.ended_by_front:
                buf = b""  # a box: the engine's end after the front's END_PATH; what it wrote went on, counts and all
            elif self.upstream_idle_s and not done_seen:  # a fleet's box went silent mid-answer (docs/fleet.md)
                buf = b"data: " + _error_body(502, f"the box answering stopped ({exc}); retry", "api_error") + b"\n\n"
                silent = "upstream went silent mid-answer"
            elif not self.upstream_idle_s:
                raise
            # else: the whole answer came; only the end of the router's answer was missing
        if run.held and not done_seen:  # the engine's end (a box's, at a front: it ended the request when asked)
            buf = b"data: " + _error_body(429, self._held_message(), "rate_limit_error") + b"\n\ndata: [DONE]\n\n"
        answer.put(buf)
        answer.finish()
        return silent

    def _event(self, ev: bytes, trace: _Trace, strip_usage: str) -> bytes | None:
        """One SSE event from the engine: its counts read; what goes to the client (None: nothing)."""
        if not ev.startswith(b"data: {"):
            return ev
        trace.events += 1
        m = self._count(ev, trace)
        if trace.first_token is None:
            self._inspect(ev[6:], trace)
        if m is None and b'"usage"' in ev:
            return self._usage_json(ev, trace, strip_usage)  # not vLLM's compact form: read the slow way
        if strip_usage and m is not None:
            if b'"choices":[]' in ev:  # the usage-only chunk: the client's when it asked for usage
                if strip_usage == "chunks":
                    return ev
                trace.events -= 1
                return None
            return ev[: m.start()] + ev[m.end():]
        return ev

    @staticmethod
    def _usage_json(ev: bytes, trace: _Trace, strip_usage: str) -> bytes | None:
        """The counts of an event whose usage is not in vLLM's compact form, and the event without what the client
        did not ask for, the slow way (a JSON parse)."""
        try:
            obj = json.loads(ev[6:])
        except ValueError:
            return ev
        if not isinstance(obj, dict):
            return ev
        usage = obj.get("usage")
        if isinstance(usage, dict):
            trace.prompt_tokens = usage.get("prompt_tokens", trace.prompt_tokens)
            trace.completion_tokens = usage.get("completion_tokens", trace.completion_tokens)
            trace.usage_seen = True
        if not strip_usage or "usage" not in obj:
            return ev
        del obj["usage"]
        if not obj.get("choices"):
            if strip_usage == "chunks":
                return ev
            trace.events -= 1
            return None
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode()

    async def _deliver(self, answer: Answer, send: Send, trace: _Trace, run: _Running) -> None:
        """The answer from memory to the client, at the client's speed."""
        while (data := await answer.take()) is not None:
            # a send that does not return is a client that stopped reading (where its acknowledged bytes cannot be
            # read: delivery.ClientProgress); the tick cuts it after stall_s
            run.sending_since = time.monotonic()
            await send({"type": "http.response.body", "body": data, "more_body": True})
            run.sending_since = 0.0
            if trace.sse and b"data: [DONE]" in data:
                # the whole answer is the client's: one that closes now (the openai SDK does, at [DONE]) before the
                # engine's end reaches this loop is served, not a 499 (seen under load with the real vLLM)
                trace.done = True
        trace.done = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        await self._acknowledged(run)

    async def _acknowledged(self, run: _Running) -> None:
        """Wait until the client's TCP stack has acknowledged the whole answer, so a reader that takes nothing
        more is still cut (stall_s), its connection reset, instead of leaving its answer in the kernel. The key's
        concurrency slot is free from now on: the answer is out of the gateway's hands."""
        self._release_key(run)
        p = run.progress
        pause = 0.001
        while p is not None and p.measured and p.waiting():
            await asyncio.sleep(pause)
            pause = min(TICK_S / 5, pause * 2)

    def _release_key(self, run: _Running) -> None:
        if not run.key_released:
            run.key_released = True
            self._release(run.key_name)

    @staticmethod
    def _inspect(data: bytes, trace: _Trace) -> None:
        """The first token's time: the first chunk with text (content, reasoning, a tool call)."""
        try:
            obj = json.loads(data)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        choices = obj.get("choices")
        if trace.first_token is None and isinstance(choices, list) and choices and isinstance(choices[0], dict):
            # the first token: text in the delta (content or reasoning) or a completion's text; vLLM's first
            # chunk carries only the role
            c0 = choices[0]
            raw_delta = c0.get("delta")
            delta: dict[str, object] = raw_delta if isinstance(raw_delta, dict) else {}
            if c0.get("text") or any(delta.get(k) for k in ("content", "reasoning", "reasoning_content", "tool_calls")):
                trace.first_token = time.monotonic()
