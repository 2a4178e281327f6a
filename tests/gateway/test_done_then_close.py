"""A client that closes once it has `[DONE]` — the openai SDK does — while the engine's end of the answer lags:
served (200, no error on its key, billed the engine's counts), not a 499 (docs/gateway.md "Streams, usage and
disconnects"). The engine here is a small HTTP/1.1 server written for the test: it sends a stream with vLLM's
per-chunk usage and its `[DONE]`, then holds the body open until its client goes (or 5 s) before ending it —
the window the real vLLM showed once under load."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from app.backend.gateway.engine_status import EngineStatus
from tests.gateway.conftest import SERVED, FixedSource
from tests.polling import wait_for

PROMPT_TOKENS = 7
WORDS = ["one", " two", " three", " four"]


def _chunk(delta: dict[str, object], finish: str | None, done_tokens: int, choices: bool = True) -> bytes:
    usage = {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS + done_tokens,
             "completion_tokens": done_tokens}
    body = {"id": "chatcmpl-lag", "object": "chat.completion.chunk", "created": 1, "model": SERVED,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}] if choices else [],
            "usage": usage}
    data = b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(data), data)


class LaggingEngine:
    """Answers one chat stream, then keeps the body open after `[DONE]` until the client leaves."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.client_left = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="lagging-engine", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:  # closed at teardown
            return
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            length = next(int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:"))
            body = head.split(b"\r\n\r\n", 1)[1]
            while len(body) < length:
                body += conn.recv(65536)
            out = [b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"]
            out += [_chunk({"content": w}, None, i + 1) for i, w in enumerate(WORDS)]
            out.append(_chunk({}, "stop", len(WORDS)))
            out.append(_chunk({}, None, len(WORDS), choices=False))  # the usage chunk
            out.append(b"e\r\ndata: [DONE]\n\n\r\n")
            conn.sendall(b"".join(out))
            conn.settimeout(5.0)
            try:  # the engine's end lags: the body stays open until its client (the gateway) goes
                if conn.recv(1) == b"":
                    self.client_left.set()
            except OSError:
                pass
            try:
                conn.sendall(b"0\r\n\r\n")
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()
        self.thread.join(10)


@pytest.fixture
def lagging() -> Iterator[LaggingEngine]:
    engine = LaggingEngine()
    try:
        yield engine
    finally:
        engine.close()


def test_a_client_closing_at_done_before_the_engines_end_is_served_and_billed(make_gateway, lagging) -> None:
    gw = make_gateway(source=FixedSource(EngineStatus(True, lagging.url, SERVED, state="ready")))
    key = gw.key("sdk")
    with gw.client(key) as c:
        chunks = list(c.chat.completions.create(model=SERVED, messages=[{"role": "user", "content": "count"}],
                                                stream=True))  # the SDK closes the response at [DONE]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == "".join(WORDS)
    wait_for(lambda: gw.server.app.answers_in_flight() == 0, 10, "the answer ended at the gateway")
    gw.keys.flush()
    (info,) = [i for i in gw.keys.infos() if i.name == "sdk"]
    assert (info.usage.requests, info.usage.errors) == (1, 0), info.usage  # a 499 was counted an error
    assert (info.usage.prompt_tokens, info.usage.completion_tokens) == (PROMPT_TOKENS, len(WORDS))
    assert [a.status for a in gw.keys.activity() if a.key_name == "sdk"] == [200]
