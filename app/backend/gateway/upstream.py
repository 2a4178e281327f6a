"""The gateway's client to the engine on its unix socket (or loopback): plain HTTP/1.1 over kept-alive
connections, parsed by httptools (llhttp, in C). The engine's address is the panel's one notion of it
(recipe/endpoint.py): `unix:/…/engine.sock` (issue 40) or `http://127.0.0.1:8000`.

Why not httpx here: on the request path its layers (httpx → httpcore → anyio, h11 in Python) were most
of the gateway's own CPU per request and of the TTFT it adds (docs/gateway.md#benchmark-benchgatewayrunpy). This client
does one thing: a request written in one piece, the answer's body handed over as it arrives.
- A connection goes back to the pool only after a whole answer; anything else (a client that left, an
  error) closes it, so the engine sees the disconnect and aborts the request.
- Idle connections are dropped after `idle_s` (below the engine's keep-alive: uvicorn's 5 s in vLLM), and
  a request on a reused connection that the engine closed before answering is sent once more, fresh.
- Reading pauses when `high_water` bytes wait unread (the gateway takes them at once into the answer's bounded
  buffer, delivery.py, so this binds only past that bound).
- `hang_up()` half-closes: the engine aborts the request, and what it had already sent is still read.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import cast
import httptools

from app.backend.recipe.endpoint import UDS_URL, EndpointError, EngineEndpoint

UDS_HOST = UDS_URL.removeprefix("http://")  # the Host header over the engine's socket


class UpstreamError(Exception):
    """The engine did not answer (refused, timed out, closed, or sent what is not HTTP)."""


class BodyNeverBegan(UpstreamError):
    """The answer's headers came, then the connection closed before any byte of its body."""


class _Conn(asyncio.Protocol):
    """One connection: the httptools callbacks fill the answer; the reader awaits `_wake`."""

    def __init__(self, high_water: int) -> None:
        self.transport: asyncio.Transport | None = None
        self._high = high_water
        self.lost = False
        self.in_use = False  # a request of ours is out on it (bytes at any other time: the connection is dropped)
        self.idle_since = 0.0
        self._begin()

    def _begin(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.error: str = ""
        self.hung_up = False  # half-closed by us (UpstreamResponse.hang_up): never reused
        self.body: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family != socket.AF_UNIX:  # small writes go out at once (the request; Nagle would wait for an ACK)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self.in_use:
            self.error = "the engine wrote on an idle connection"
            self.close()
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = f"the engine's answer is not valid HTTP ({exc})"
            self.close()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._wake()

    # -- httptools callbacks ------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > self._high and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()  # asked here: llhttp answers False once past the end

    # -- the reader's side --------------------------------------------------------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait(self) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def take(self) -> bytes:
        data = b"".join(self.body) if len(self.body) > 1 else self.body[0]
        self.body.clear()
        self.buffered = 0
        if self.paused and self.transport is not None and not self.lost:
            self.paused = False
            self.transport.resume_reading()
        return data

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.lost and not self.error and not self.hung_up

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class UpstreamResponse:
    """The engine's answer: status and headers now, the body through `chunks()` or `read()`; `close()`
    when done (back to the pool after a whole answer, closed otherwise)."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int], conn: _Conn):
        self._pool = pool
        self._key = key
        self._conn = conn
        self.status_code = conn.status
        self.headers = conn.headers
        self._closed = False

    async def chunks(self, idle_s: float = 0.0, first_s: float = 0.0) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked framing removed), everything available joined into one piece.
        `idle_s` > 0: UpstreamError when nothing more arrives for that long (a fleet's front: the box behind the
        router was cut off or frozen, and TCP alone would wait for minutes; docs/fleet.md#faults); `first_s`: the
        bound before the first byte instead (a prefill or a queue ahead may take long; a silence mid-answer not)."""
        c = self._conn
        got = False
        while True:
            if c.body:
                got = True
                yield c.take()
                continue
            if c.complete:
                return
            if c.lost or c.error:
                if "content-length" in c.headers or "chunked" in c.headers.get("transfer-encoding", ""):
                    raise UpstreamError(c.error or "the engine closed the connection before the end of its answer")
                return  # an answer delimited by the connection's end
            if idle_s > 0:
                bound = idle_s if got or not first_s else first_s
                try:
                    # the waiter armed in this step, not in a task wait_for would start later: data whose callback
                    # ran in between (uvloop runs I/O callbacks first) was lost until the bound (docs/fleet.md#faults)
                    async with asyncio.timeout(bound):
                        await c.wait()
                except TimeoutError:
                    raise UpstreamError(f"nothing came from upstream for {bound:g} s "
                                        f"{'mid-answer' if got else 'after its headers'}") from None
            else:
                await c.wait()

    async def read(self) -> bytes:
        return b"".join([part async for part in self.chunks()])

    async def first_bytes(self, timeout_s: float) -> None:
        """Wait for the body's first bytes (left in place for `chunks()`) or its end. `BodyNeverBegan` when the
        connection closed before any (a fleet's front: nothing reached its client yet, so it sends the request
        again, proxy.GatewayApp._request); UpstreamError when none came within `timeout_s`."""
        c = self._conn
        try:
            async with asyncio.timeout(timeout_s):
                while not (c.body or c.complete):
                    if c.lost or c.error:
                        raise BodyNeverBegan(c.error or "the engine closed the connection before its answer's body")
                    await c.wait()
        except TimeoutError:
            raise UpstreamError(f"nothing came from upstream for {timeout_s:g} s after its headers") from None

    def hang_up(self) -> None:
        """Half-close: the engine sees its client gone and aborts the request, while what it already sent can
        still be read (its counts: docs/gateway.md "Usage"). The connection is not reused after this."""
        t = self._conn.transport
        self._conn.hung_up = True
        if t is not None and not t.is_closing() and t.can_write_eof():
            t.write_eof()
        elif t is not None:
            t.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._conn.reusable():
            self._pool.release(self._key, self._conn)
        else:
            self._conn.close()


class UpstreamPool:
    """Kept-alive connections to the engine, one request at a time on each."""

    def __init__(self, connect_timeout_s: float = 5.0, max_idle: int = 64, idle_s: float = 4.0,
                 high_water: int = 256 * 1024):
        self._connect_timeout = connect_timeout_s
        self._max_idle = max_idle
        self._idle_s = idle_s
        self._high = high_water
        self._idle: dict[tuple[str, int], list[_Conn]] = {}
        self._closed = False

    @staticmethod
    def origin(base_url: str) -> tuple[str, int]:
        """(host, port), or (socket path, 0) for an engine on a unix socket."""
        try:
            ep = EngineEndpoint.parse(base_url)
        except EndpointError as exc:
            raise UpstreamError(str(exc)) from None
        return (ep.uds, 0) if ep.uds else (ep.host, ep.port)

    async def _connect(self, key: tuple[str, int]) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            if key[1] == 0:  # the engine's unix socket
                opening = loop.create_unix_connection(lambda: _Conn(self._high), key[0])
            else:
                opening = loop.create_connection(lambda: _Conn(self._high), key[0], key[1])
            _, conn = await asyncio.wait_for(opening, self._connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            where = f"unix:{key[0]}" if key[1] == 0 else f"{key[0]}:{key[1]}"
            raise UpstreamError(f"cannot connect to the engine at {where} ({type(exc).__name__})") from None
        return conn

    def _take_idle(self, key: tuple[str, int]) -> _Conn | None:
        conns = self._idle.get(key)
        now = time.monotonic()
        while conns:
            conn = conns.pop()
            if not conn.lost and not conn.error and now - conn.idle_since < self._idle_s:
                return conn
            conn.close()
        return None

    def release(self, key: tuple[str, int], conn: _Conn) -> None:
        conns = self._idle.setdefault(key, [])
        if self._closed or len(conns) >= self._max_idle:
            conn.close()
            return
        conn.in_use = False
        conn.idle_since = time.monotonic()
        conns.append(conn)

    async def request(self, base_url: str, method: str, target: str, headers: dict[str, str],
                      body: bytes = b"") -> UpstreamResponse:
        """Send one request; returns once the answer's status and headers are in."""
        key = self.origin(base_url)
        host = UDS_HOST if key[1] == 0 else f"{key[0]}:{key[1]}"
        head = [f"{method} {target} HTTP/1.1\r\nhost: {host}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in headers.items()]
        if method != "GET" or body:
            head.append(f"content-length: {len(body)}\r\n")
        data = "".join(head).encode("latin-1") + b"\r\n" + body
        reused = self._take_idle(key)
        for conn in ([reused] if reused is not None else []) + [None]:
            conn = conn or await self._connect(key)
            conn._begin()
            conn.in_use = True
            assert conn.transport is not None
            conn.transport.write(data)
            try:
                while not conn.head_done:
                    if conn.lost or conn.error:
                        raise UpstreamError(conn.error or "the engine closed the connection before answering")
                    await conn.wait()
            except UpstreamError:
                conn.close()
                if conn is reused and not conn.got_bytes:
                    continue  # the engine had closed this idle connection: once more on a fresh one
                raise
            except BaseException:  # cancelled (the client left): the engine must see the connection close
                conn.close()
                raise
            return UpstreamResponse(self, key, conn)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
