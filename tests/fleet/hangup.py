"""A client that hangs up on a chat request: the fleet tests' way to leave mid-answer (docs/fleet.md "Usage at the
front")."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from urllib.parse import urlsplit

from tests.polling import wait_for


def hang_up(url: str, key: str, started: Callable[[], bool], model: str = "deepseek-v4-flash", timeout_s: float = 20,
            **payload: object) -> None:
    """A chat request (non-streaming unless `stream` is given) whose client closes its connection once `started()`
    (the engine generating, say)."""
    u = urlsplit(url)
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], **payload}).encode()
    with socket.create_connection((u.hostname, u.port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"authorization: Bearer " + key.encode() + b"\r\ncontent-length: " + str(len(body)).encode() +
                  b"\r\n\r\n" + body)
        wait_for(started, timeout_s, "the request generating at the engine", 0.05)
