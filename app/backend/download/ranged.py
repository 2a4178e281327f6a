"""One ranged GET through libcurl (pycurl), its body handed to a callback as it arrives.

Why libcurl and not httpx for the bytes: h11 parses and copies every 64 KiB read, CPU taken from
decompression on a small box (docs/downloads.md, "Measurements behind the code"). httpx still does the small API calls (hub.py).
libcurl also brings the usual proxy variables, TLS and HTTP/2 for free.

One `RangeGetter` per fetch worker thread (an easy handle keeps its connection alive between
requests; handles are not thread-safe). The GIL is released while libcurl waits and reads.

libcurl hands the body over in pieces of at most 16 KiB (CURL_MAX_WRITE_SIZE; a TLS record is no
larger either), each a Python callback taking the GIL the decoders and tar writers also need. So the
write callback is the C-level `io.BufferedWriter.write` of a per-worker buffer, and Python sees the body
once per BODY_BUFFER (16x fewer calls). 256 KiB, not 512: 48 fetch workers at 24 connections hold
12 MiB less (docs/downloads.md, "Measurements behind the code").
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import certifi
import pycurl

from app.backend.download.types import DownloadError, Stopped

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

# Per fetch worker (up to 16 per artifact at 24 connections), so they bound peak RSS: libcurl's
# receive buffer (it calls back with at most 16 KiB anyway) and the body buffer in front of Python.
BUFFER_SIZE = 256 << 10
BODY_BUFFER = 256 << 10
FLUSH_S = 0.25  # the body buffer is handed on at least this often: progress never looks frozen on a slow link
USER_AGENT = "moet-panel/0.1"


@dataclass
class Reply:
    """What came back: status and headers (last response's, lower-case names) and why it ended early."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    aborted: BaseException | None = None  # raised in a callback: stop, stall, bad range, disk error
    transport_error: str = ""  # libcurl's own error (connection refused, reset, partial body...)


class _Body(io.RawIOBase):
    """What the body buffer flushes into: the current request's `on_body`, in pieces of up to BODY_BUFFER.

    It never raises (an exception in a libcurl callback is printed and aborts with a generic error):
    it records the exception in the reply and drops what follows; the progress callback then aborts
    the transfer. Error pages (non-2xx) are read and dropped; the status says what happened.
    """

    def __init__(self) -> None:
        super().__init__()
        self.reply: Reply | None = None
        self.on_body: Callable[[Reply, memoryview], None] = lambda reply, piece: None
        self.flushed = time.monotonic()

    def writable(self) -> bool:
        return True

    def write(self, b: ReadableBuffer) -> int:
        view = memoryview(b)
        self.flushed = time.monotonic()
        reply = self.reply
        if reply is None or reply.aborted is not None or not 200 <= reply.status < 300:
            return len(view)
        try:
            self.on_body(reply, view)
        except BaseException as exc:  # noqa: BLE001 - handed back to the caller after perform()
            reply.aborted = exc
        return len(view)


class RangeGetter:
    def __init__(self, connect_timeout_s: float, stall_s: float) -> None:
        self.stall_s = stall_s
        self._body = _Body()
        self._buffer = io.BufferedWriter(self._body, buffer_size=BODY_BUFFER)  # one per worker, reused
        c = self.curl = pycurl.Curl()
        c.setopt(pycurl.NOSIGNAL, 1)  # threads: no SIGALRM for DNS timeouts
        c.setopt(pycurl.FOLLOWLOCATION, 0)  # the Hub's redirect is resolved (and cached) by hub.py
        restrict_protocols(c)
        c.setopt(pycurl.CONNECTTIMEOUT_MS, int(connect_timeout_s * 1000))
        c.setopt(pycurl.BUFFERSIZE, BUFFER_SIZE)
        c.setopt(pycurl.CAINFO, certifi.where())
        c.setopt(pycurl.USERAGENT, USER_AGENT)
        c.setopt(pycurl.NOPROGRESS, 0)  # the progress callback is our stall watchdog, stop check and flush clock
        c.setopt(pycurl.WRITEFUNCTION, self._buffer.write)

    def close(self) -> None:
        self.curl.close()

    def get(self, url: str, headers: dict[str, str], on_body: Callable[[Reply, memoryview], None],
            stop: Callable[[], bool]) -> Reply:
        """GET url; `on_body(reply, piece)` sees the body of a 2xx answer, in order, and may raise to abort.

        Every byte that arrived has been handed to `on_body` when this returns, also after a drop.
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

        def on_progress(_dltotal: int, dlnow: int, _ultotal: int, _ulnow: int) -> int:
            now = time.monotonic()
            if reply.aborted is not None:  # on_body raised (or the range is complete)
                return 1
            if now - body.flushed >= FLUSH_S:
                self._buffer.flush()
                body.flushed = now
                if reply.aborted is not None:
                    return 1
            if stop():
                reply.aborted = Stopped()
                return 1
            if dlnow != last_byte[1]:
                last_byte[:] = [now, dlnow]
            elif now - last_byte[0] > self.stall_s:
                reply.aborted = StallError(f"no byte for {self.stall_s:g} s (stalled connection)")
                return 1
            return 0

        body = self._body
        body.reply, body.on_body, body.flushed = reply, on_body, time.monotonic()
        c = self.curl
        c.setopt(pycurl.URL, url)
        c.setopt(pycurl.HTTPHEADER, [f"{k}: {v}" for k, v in headers.items()])
        c.setopt(pycurl.HEADERFUNCTION, on_header)
        c.setopt(pycurl.XFERINFOFUNCTION, on_progress)
        try:
            c.perform()
        except pycurl.error as exc:
            if reply.aborted is None:
                reply.transport_error = exc.args[1] if len(exc.args) > 1 else str(exc)
        finally:
            self._buffer.flush()  # whatever arrived before a drop or an abort reaches on_body (or is dropped)
            body.reply = None
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
