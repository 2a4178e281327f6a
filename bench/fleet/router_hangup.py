"""What vllm-router does with a stream whose client hangs up, and what it passes on (docs/fleet.md "The router as
installed"): a worker double on loopback streams 40 chunks at 10 a second, each with its usage, and logs the request
it got (its `stream_options`, its `x-` headers) and when the router closed its connection; a client asks through the
router, reads 5 chunks, then half-closes (or closes) and reads for 2 s more.

    .venv/bin/python bench/fleet/router_hangup.py

Found with 0.1.17: `continuous_usage_stats` dropped and `include_usage` kept; `x-` headers passed; after the client's
half-close the router closes the client's connection at once (no chunk more) and the worker's at its next write."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

T0 = time.monotonic()


def log(*parts: object) -> None:
    print(f"{time.monotonic() - T0:7.3f}", *parts, flush=True)


async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    hdrs = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in head[1:] if ":" in ln)}
    body = await reader.readexactly(int(hdrs.get("content-length", "0")))
    if head[0].startswith("GET /health"):
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}")
        await writer.drain()
        writer.close()
        return
    req = json.loads(body)
    log("worker got", head[0], "stream_options:", req.get("stream_options"),
        "x- headers:", {k: v for k, v in hdrs.items() if k.startswith("x-")})
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
    eof = asyncio.ensure_future(reader.read(1))
    for i in range(40):
        usage = {"prompt_tokens": 5, "completion_tokens": i + 1, "total_tokens": i + 6}
        ev = ("data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "t"}}], "usage": usage}) +
              "\n\n").encode()
        writer.write(b"%x\r\n%s\r\n" % (len(ev), ev))
        await writer.drain()
        if eof.done():
            log(f"worker: the router closed its connection (after chunk {i + 1} was written)")
            writer.close()
            return
        await asyncio.sleep(0.1)
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    writer.close()
    log("worker: whole answer sent")


def client(port: int, how: str) -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40,
                       "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  f"x-moet-request: abc123\r\nx-session-id: s1\r\ncontent-length: {len(body)}\r\n\r\n{body}".encode())
        got = b""
        while got.count(b"completion_tokens") < 5:
            got += s.recv(65536)
        log(f"client read 5 chunks, then {how}")
        if how == "close":
            return
        s.shutdown(socket.SHUT_WR)
        s.settimeout(0.2)
        more, end = 0, time.monotonic() + 2.0
        while time.monotonic() < end:
            try:
                data = s.recv(65536)
            except TimeoutError:
                continue
            if not data:
                log("client: the router closed the connection")
                break
            more += data.count(b"completion_tokens")
        log(f"client: {more} chunks more after its half-close")


async def main() -> None:
    from tests.conftest import free_port

    wport, rport, mport = free_port(), free_port(), free_port()
    srv = await asyncio.start_server(worker, "127.0.0.1", wport)
    router = subprocess.Popen([str(ROOT / ".venv" / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(rport),
                               "--policy", "round_robin", "--prometheus-host", "127.0.0.1", "--prometheus-port",
                               str(mport), "--worker-urls", f"http://127.0.0.1:{wport}", "--health-check-endpoint",
                               "/health", "--disable-circuit-breaker", "--log-level", "warning"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", rport), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        for how in ("half-close", "close", "half-close"):
            await asyncio.to_thread(client, rport, how)
            await asyncio.sleep(1.0)  # the worker's log of its connection's end, before the next try
    finally:
        router.terminate()
        router.wait()
        srv.close()


if __name__ == "__main__":
    asyncio.run(main())
