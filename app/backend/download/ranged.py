"""One ranged GET through libcurl (pycurl), its body handed to a callback as it arrives.

Why libcurl and not httpx for the bytes: receiving 1.68 GB from the local hub cost 1.9 s of CPU
through httpx (h11 parses and copies every 64 KiB read) against 0.5 s through libcurl, on a 2-core
box where that CPU is taken from decompression. httpx still does the small API calls (hub.py).
libcurl also brings the usual proxy variables, TLS and HTTP/2 for free.

One `RangeGetter` per fetch worker thread (an easy handle keeps its connection alive between
requests; handles are not thread-safe). The GIL is released while libcurl waits and reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import certifi
import pycurl

from app.backend.download.types import DownloadError, Stopped

# Per fetch worker (up to 16 per artifact at 24 connections), so they bound peak RSS: libcurl's
# receive buffer (it calls back with at most 16 KiB anyway) and our staging buffer.
BUFFER_SIZE = 256 << 10
BODY_BUFFER = 512 << 10
USER_AGENT = "moet-panel/0.1"


@dataclass
class Reply:
    """What came back: status and headers (last response's, lower-case names) and why it ended early."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    aborted: BaseException | None = None  # raised in a callback: stop, stall, bad range, disk error
    transport_error: str = ""  # libcurl's own error (connection refused, reset, partial body...)


class RangeGetter:
    def __init__(self, connect_timeout_s: float, stall_s: float) -> None:
        self.stall_s = stall_s
        self.body_buffer = bytearray(BODY_BUFFER)  # the caller's staging buffer, one per worker, reused
        c = self.curl = pycurl.Curl()
        c.setopt(pycurl.NOSIGNAL, 1)  # threads: no SIGALRM for DNS timeouts
        c.setopt(pycurl.FOLLOWLOCATION, 0)  # the Hub's redirect is resolved (and cached) by hub.py
        restrict_protocols(c)
        c.setopt(pycurl.CONNECTTIMEOUT_MS, int(connect_timeout_s * 1000))
        c.setopt(pycurl.BUFFERSIZE, BUFFER_SIZE)
        c.setopt(pycurl.CAINFO, certifi.where())
        c.setopt(pycurl.USERAGENT, USER_AGENT)
        c.setopt(pycurl.NOPROGRESS, 0)  # the progress callback is our stall watchdog and stop check

    def close(self) -> None:
        self.curl.close()

    def get(self, url: str, headers: dict[str, str], on_body: Callable[[Reply, bytes], None],
            stop: Callable[[], bool]) -> Reply:
        """GET url; `on_body(reply, chunk)` sees every body chunk of a 2xx answer and may raise to abort.

        Never raises for HTTP statuses or transport errors: the caller reads `Reply`.
        """
        reply = Reply()
        if url.split(":", 1)[0].lower() not in ("http", "https"):  # before libcurl sees it (issue 13)
            reply.aborted = UnsafeUrlError(f"refused to download from {url[:120]!r}: only http and https are allowed")
            return reply
        last_byte = [time.monotonic(), -1]

        def on_header(line: bytes) -> None:
            text = line.decode("latin-1").strip()
            if text.startswith("HTTP/"):
                reply.status, reply.headers = int(text.split()[1]), {}  # a new response (e.g. after 100)
            elif ":" in text:
                name, _, value = text.partition(":")
                reply.headers[name.strip().lower()] = value.strip()

        def on_write(chunk: bytes) -> int | None:
            if not 200 <= reply.status < 300:
                return None  # an error page: read and dropped, the status says what happened
            try:
                on_body(reply, chunk)
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller after perform()
                reply.aborted = exc
                return 0  # != len(chunk): libcurl aborts the transfer
            return None

        def on_progress(_dltotal: int, dlnow: int, _ultotal: int, _ulnow: int) -> int:
            now = time.monotonic()
            if stop():
                reply.aborted = Stopped()
                return 1
            if dlnow != last_byte[1]:
                last_byte[:] = [now, dlnow]
            elif now - last_byte[0] > self.stall_s:
                reply.aborted = StallError(f"no byte for {self.stall_s:g} s (stalled connection)")
                return 1
            return 0

        c = self.curl
        c.setopt(pycurl.URL, url)
        c.setopt(pycurl.HTTPHEADER, [f"{k}: {v}" for k, v in headers.items()])
        c.setopt(pycurl.HEADERFUNCTION, on_header)
        c.setopt(pycurl.WRITEFUNCTION, on_write)
        c.setopt(pycurl.XFERINFOFUNCTION, on_progress)
        try:
            c.perform()
        except pycurl.error as exc:
            if reply.aborted is None:
                reply.transport_error = exc.args[1] if len(exc.args) > 1 else str(exc)
        return reply


def restrict_protocols(c: pycurl.Curl) -> None:
    """http/https only, for the request and any redirect libcurl might follow (file://, dict://, ftp:// never).

    CURLOPT_PROTOCOLS_STR (libcurl >= 7.85) where pycurl exposes it, else the older bitmask options.
    """
    protocols, redirects = getattr(pycurl, "PROTOCOLS_STR", None), getattr(pycurl, "REDIR_PROTOCOLS_STR", None)
    if protocols is not None and redirects is not None:
        c.setopt(protocols, "http,https")
        c.setopt(redirects, "http,https")
    else:
        c.setopt(pycurl.PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)
        c.setopt(pycurl.REDIR_PROTOCOLS, pycurl.PROTO_HTTP | pycurl.PROTO_HTTPS)


class StallError(Exception):
    """No byte arrived for stall_s on a connection (transient: retried with Range)."""


class UnsafeUrlError(DownloadError):
    """A download URL with a scheme other than http/https (not retried)."""

    kind = "unsafe"
