"""HTTP request handler of the SIMULATED engine: routes, SSE streaming, disconnect detection."""

from __future__ import annotations

import json
import queue
import select
import socket
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

from .api import (
    ApiError, DeltaBuilder, GenRequest, chat_chunk, completion_chunk,
    full_response, merge_deltas, parse_request, token_source, tokenize, usage, usage_chunk,
)
from .boot import VLLM_VERSION
from .engine import SimRequest

if TYPE_CHECKING:
    from .server import SimEngineServer

POLL_S = 0.05  # how often a waiting handler checks for a client disconnect


class ClientGone(Exception):
    pass


def client_gone(sock: socket.socket) -> bool:
    """True once the peer has closed (readable with EOF) or reset the connection."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


def make_handler(server: "SimEngineServer") -> type[BaseHTTPRequestHandler]:
    class Handler(_Handler):
        sim = server
        # on the engine's unix socket (--uds) there is no Nagle to disable (TCP_NODELAY fails there)
        disable_nagle_algorithm = not server.config.uds

    return Handler


class _Handler(BaseHTTPRequestHandler):
    sim: "SimEngineServer"
    _gone_checked: float = 0.0
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""
    # TCP_NODELAY, as vLLM's asyncio transports have: without it Nagle held the first streamed token
    # behind the headers until the client's delayed ACK (~40 ms), so a 100-token self-test read ~1 tok/s
    # above the configured rate (docs/real-engine.md, difference 21)
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass  # access lines are written in uvicorn's format by _access()

    def _access(self, status: int) -> None:
        phrase = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  503: "Service Unavailable"}.get(status, "")
        peer = self.client_address  # ('127.0.0.1', 51234), or '' on a unix socket, where uvicorn prints no address
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        self.sim.log.raw(f'(APIServer pid={self.sim.log.api_pid}) INFO:     {where} - '
                         f'"{self.command} {self.path} HTTP/1.1" {status} {phrase}')

    # --- plain responses --------------------------------------------------------------------------

    def _send(self, status: int, body: bytes = b"", ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)
        self._access(status)

    def _json(self, status: int, obj: object) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, err: ApiError) -> None:
        self.sim.record_error()
        self._json(err.status, err.body())

    def _loading(self) -> bool:
        if self.sim.state == "ready":
            return False
        self._send(503, b"")
        return True

    # --- routing ------------------------------------------------------------------------------------

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(200 if self.sim.state == "ready" else 503, b"")
        elif path == "/ping":
            self._send(200 if self.sim.state == "ready" else 503, b"")
        elif path == "/version":
            self._json(200, {"version": VLLM_VERSION, "simulated": True})
        elif path == "/metrics":
            self._send(200, self.sim.metrics.render().encode(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/load":
            running, waiting = self.sim.engine.load()
            self._json(200, {"server_load": running + waiting})
        elif path == "/v1/models":
            if not self._loading():
                self._json(200, self._models())
        else:
            self._json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        kinds = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
        body = self._read_body()
        if path == "/tokenize":
            self._tokenize(body)
            return
        if path not in kinds:
            self._json(404 if path not in ("/health", "/v1/models") else 405, {"detail": "Not Found"})
            return
        if self._loading():
            return
        cfg = self.sim.config
        try:
            if body is None:
                raise ApiError(400, "request body is not valid JSON")
            req = parse_request(kinds[path], body, cfg.served_name, cfg.model, cfg.max_model_len,
                                    cfg.reasoning_mode)
        except ApiError as err:
            self._error(err)
            return
        self._generate(req)

    def _tokenize(self, body: object) -> None:
        if self._loading():
            return
        try:
            self._json(200, tokenize(body, self.sim.config.max_model_len))
        except ApiError as err:
            self._error(err)

    def _read_body(self) -> object:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            return json.loads(raw) if raw else {}
        except ValueError:
            return None

    def _models(self) -> dict[str, object]:
        cfg = self.sim.config
        card = {"id": cfg.served_name, "object": "model", "created": int(self.sim.started_at), "owned_by": "vllm",
                "root": cfg.model, "parent": None, "max_model_len": cfg.max_model_len, "simulated": True,
                "permission": [{"id": "modelperm-sim", "object": "model_permission", "created": int(self.sim.started_at),
                                "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                                "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                                "organization": "*", "group": None, "is_blocking": False}]}
        return {"object": "list", "data": [card]}

    # --- generation ---------------------------------------------------------------------------------

    def _generate(self, req: GenRequest) -> None:
        plan, source = token_source(req, self.sim.config.seed, self.sim.quality_tier, self.sim.needle_max_tokens,
                                    self.sim.config.build)
        room = max(1, self.sim.config.max_model_len - req.prompt_tokens)  # vLLM cuts max_tokens to the room left
        limit = min(req.max_tokens, room) if req.max_tokens else room
        sim_req = SimRequest(request_id=req.request_id, prompt_tokens=req.prompt_tokens, limit=limit,
                             natural=max(plan.natural_tokens, req.min_tokens), ignore_eos=req.ignore_eos,
                             source=source)
        self.sim.record_request(dict(req.params))
        self.sim.submit(sim_req)
        aborted = False
        try:
            if req.stream:
                self._stream(req, sim_req)
            else:
                self._whole(req, sim_req)
        except ClientGone:
            aborted = not sim_req.finish_reason  # a request the engine had finished stays finished, as in vLLM
            sim_req.abort()
        finally:
            if sim_req.finish_reason or aborted:
                self.sim.record_end(sim_req, aborted)

    def _next_items(self, sim_req: SimRequest) -> list[tuple[str, str, str]]:
        """Block until at least one item; return everything queued (a catch-up burst is one chunk)."""
        # checked every POLL_S even while tokens flow: a non-streaming answer writes nothing until its end, and
        # vLLM aborts it at the client's hang-up (its API server watches for the disconnect, `with_cancellation`)
        now = time.monotonic()
        if now - self._gone_checked >= POLL_S:
            self._gone_checked = now
            if client_gone(self.connection):
                raise ClientGone()
        while True:
            try:
                items = [sim_req.out.get(timeout=POLL_S)]
                break
            except queue.Empty:
                if client_gone(self.connection):
                    raise ClientGone() from None
        while True:
            try:
                items.append(sim_req.out.get_nowait())
            except queue.Empty:
                return items

    def _cut(self) -> None:
        """Engine died: drop the connection mid-response (no [DONE], no chunk terminator)."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _whole(self, req: GenRequest, sim_req: SimRequest) -> None:
        tokens: list[tuple[str, str]] = []
        while True:
            for kind, a, b in self._next_items(sim_req):
                if kind == "tok":
                    tokens.append((a, b))
                elif kind == "end":
                    self._json(200, full_response(req, tokens, a))
                    return
                else:
                    self._cut()
                    return

    def _stream(self, req: GenRequest, sim_req: SimRequest) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        self._access(200)
        builder = DeltaBuilder(req.reasoning_mode)
        role_sent = req.kind != "chat"
        sent = 0
        while True:
            items = self._next_items(sim_req)
            finish = next((a for k, a, _ in items if k == "end"), None)
            if any(k == "dead" for k, _, _ in items):
                self._cut()
                return
            toks = [(a, b) for k, a, b in items if k == "tok"]
            if not role_sent:  # vLLM's first chunk, the role, comes with the first output: after the prefill
                self._event(self._counted(req, chat_chunk(req, {"role": "assistant", "content": ""}), 0))
                role_sent = True
            sent += len(toks)
            self._send_tokens(req, builder, toks, finish, sent)
            if finish is not None:
                if req.include_usage:
                    self._event(usage_chunk(req, sim_req.produced))
                self._chunk(b"data: [DONE]\n\n")
                self._chunk(b"")
                return

    @staticmethod
    def _counted(req: GenRequest, chunk: dict[str, object], completion_tokens: int) -> dict[str, object]:
        """vLLM's continuous_usage_stats: the counts so far on every chunk (the role chunk's: the prompt's, 0)."""
        if req.continuous_usage:
            chunk["usage"] = usage(req.prompt_tokens, completion_tokens)
        return chunk

    def _send_tokens(self, req: GenRequest, builder: DeltaBuilder, toks: list[tuple[str, str]],
                     finish: str | None, sent: int) -> None:
        if req.kind == "completion":
            self._event(self._counted(req, completion_chunk(req, "".join(t for _, t in toks), finish), sent))
            return
        deltas = merge_deltas([builder.delta(k, t) for k, t in toks])
        if finish is not None and builder.in_think:
            deltas.append({"content": "</think>"})
        if not deltas:
            deltas = [{}] if finish is not None else []
        for i, d in enumerate(deltas):  # a catch-up burst's merged deltas carry the count after the burst
            self._event(self._counted(req, chat_chunk(req, d, finish if i == len(deltas) - 1 else None), sent))

    def _event(self, obj: dict[str, object]) -> None:
        self._chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

    def _chunk(self, data: bytes) -> None:
        # uvicorn writes nothing after the client's EOF (its transport closes; later sends are dropped) and vLLM
        # aborts the request: the tokens it counted after that are never sent (docs/simengine.md, "The token counters")
        if client_gone(self.connection):
            raise ClientGone()
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        except OSError as exc:
            raise ClientGone() from exc
