"""The gateway's client to the engine (app/backend/gateway/upstream.py) against a small HTTP/1.1 server
written here: kept-alive reuse, a resend when the engine had closed an idle connection, the connection
closed when a reader leaves mid-answer (the engine's abort signal), and a refused connect."""

from __future__ import annotations

import asyncio
import socket

import pytest

from tests.aio import run_async
from app.backend.gateway.upstream import UpstreamError, UpstreamPool


class Engine:
    """Counts connections; answers each request with `answer(n)` (n: requests on that connection so far)."""

    def __init__(self, close_after_answer: bool = False, endless: bool = False):
        self.connections = 0
        self.closed_by_client = asyncio.Event()
        self.close_after_answer = close_after_answer
        self.endless = endless
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                if self.endless:
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                    while True:  # until the client closes
                        writer.write(b"7\r\ndata: x\r\n")
                        await writer.drain()
                        await asyncio.sleep(0.01)
                out = b"echo:" + body
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n%s" % (len(out), out))
                await writer.drain()
                if self.close_after_answer:
                    writer.close()  # keep-alive announced, then closed: a stale idle connection for the pool
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed_by_client.set()
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


def test_kept_alive_connection_is_reused() -> None:
    async def go() -> None:
        engine = Engine()
        pool = UpstreamPool()
        async with engine as url:
            for i in range(3):
                r = await pool.request(url, "POST", "/v1/x", {"content-type": "application/json"}, b"%d" % i)
                assert r.status_code == 200 and await r.read() == b"echo:%d" % i
                r.close()
            assert engine.connections == 1
        await pool.aclose()

    run_async(go, 20)


def test_an_idle_connection_the_engine_closed_is_replaced() -> None:
    async def go() -> None:
        engine = Engine(close_after_answer=True)
        pool = UpstreamPool()
        async with engine as url:
            for i in range(3):
                r = await pool.request(url, "POST", "/v1/x", {}, b"%d" % i)
                assert await r.read() == b"echo:%d" % i
                r.close()
                await asyncio.sleep(0.05)  # let the engine's close arrive (the race without it is covered too)
            assert engine.connections == 3
        await pool.aclose()

    run_async(go, 20)


def test_a_reader_that_leaves_mid_answer_closes_the_engine_connection() -> None:
    async def go() -> None:
        engine = Engine(endless=True)
        pool = UpstreamPool()
        async with engine as url:
            r = await pool.request(url, "POST", "/v1/x", {}, b"{}")
            got = b""
            async for part in r.chunks():
                got += part
                if len(got) > 20:
                    break
            r.close()
            await asyncio.wait_for(engine.closed_by_client.wait(), 5)
        await pool.aclose()

    run_async(go, 20)


def test_no_engine_is_an_upstream_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused

        async def go() -> None:
            with pytest.raises(UpstreamError, match="cannot connect"):
                await UpstreamPool().request(f"http://127.0.0.1:{port}", "GET", "/v1/models", {})

        run_async(go, 20)


def test_a_reader_with_an_idle_bound_is_woken_by_data_that_came_just_before_its_wait() -> None:
    """A fleet's front reads with an idle bound (chunks(idle_s)). Data whose I/O callback runs after the reader
    found nothing and before its wait is armed (uvloop runs I/O callbacks ahead of the steps call_soon queued)
    must wake it at once; lost, it sat unread until the bound: the last events of about 1 stream in 100 through
    the front, then a 10 s silence and an error event after the box had sent everything (docs/fleet.md#faults)."""
    import time

    from app.backend.gateway.upstream import UpstreamResponse, _Conn

    async def go() -> None:
        conn = _Conn(1 << 20)
        conn.in_use = True
        conn.data_received(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n7\r\ndata: 1\r\n")
        chunks = UpstreamResponse(UpstreamPool(), ("127.0.0.1", 9), conn).chunks(idle_s=3.0)
        assert await chunks.__anext__() == b"data: 1"
        t = time.monotonic()
        nxt = asyncio.ensure_future(chunks.__anext__())  # the reader's next step is queued first ...
        asyncio.get_running_loop().call_soon(conn.data_received, b"7\r\ndata: 2\r\n0\r\n\r\n")  # ... the data's next
        assert await asyncio.wait_for(nxt, 10) == b"data: 2"
        assert time.monotonic() - t < 1.0, "the data waited for the idle bound"
        with pytest.raises(StopAsyncIteration):
            await chunks.__anext__()

    run_async(go, 20)
