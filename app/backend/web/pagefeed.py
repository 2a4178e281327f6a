"""The page's one server-sent stream (issue 42, docs/ui-and-safety.md#the-page-feed): what changed, pushed.

Each part of the page (the header, each tab) is a *topic* with a version: a short digest of what that part
would show. `GET /moet/feed` (served by the web gate behind its Host/Origin/session checks) sends every
topic's version once, then only the topics whose version moved, when they move — nothing at all while
nothing changes. The page script (assets/js/page-feed.js) redraws a topic only when it is on screen and its
version differs from the one it drew, and drops the stream while the page is in the background.

Versions are computed once per `period_s` for all open pages together (`Versions`), not per page; after a
stream's first line (every topic), only the topics its page shows (issue 49: a hidden tab's version is of no
use to a page, and the Service tab's took 2.4 ms a second).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Protocol
from urllib.parse import parse_qs

from app.backend.contracts import SESSION_ALIVE, Message, Receive, Scope, Send

PATH = "/moet/feed"
ASSET_PREFIX = "/moet/js/"
DYGRAPHS_DIR = Path("/usr/share/javascript/dygraphs")  # Debian's libjs-dygraphs
KEEPALIVE_S = 30.0  # a comment line now and then: a proxy does not close a quiet stream

log = logging.getLogger("moet_panel.pagefeed")


def digest(value: object) -> str:
    """A short stable digest of what a topic shows (its repr)."""
    return hashlib.blake2b(repr(value).encode(), digest_size=8).hexdigest()


class Versions:
    """Every topic's version now, computed at most once per `period_s` whoever asks (one computation a
    second for any number of pages). A topic without a version function gets the clock's second: it
    redraws each second while shown (the behaviour of the former page timer, for that tab only)."""

    def __init__(self, sources: Mapping[str, Callable[[], object] | None], period_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 html: Mapping[str, Callable[[], str]] | None = None) -> None:
        self.sources = dict(sources)
        self.html_sources = dict(html or {})
        self.period_s = period_s
        self.clock = clock
        self._lock = threading.Lock()
        self._at = float("-inf")
        self._now: dict[str, str] = {}
        self._html: dict[str, str] = {}
        self._failed: set[str] = set()
        self._fresh: set[str] = set()  # topics computed in this period
        self.computed = 0  # how many times the versions were computed (a clock tests can wait on)

    def now(self) -> dict[str, str]:
        """{topic: version}."""
        return self.both()[0]

    def both(self, topics: Collection[str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
        """({topic: version}, {element id: its HTML}) as they are now. `topics`: only these topics' versions
        (a stream after its first line: the tab its page shows; a hidden tab's version is of no use to it, and
        some cost milliseconds, issue 49); None: every topic. Each is computed at most once per period."""
        with self._lock:
            t = self.clock()
            if t - self._at >= self.period_s:
                self._fresh.clear()
                self._html = {eid: self._markup(eid, fn) for eid, fn in self.html_sources.items()}
                self._at = t
                self.computed += 1
            want = list(self.sources) if topics is None else [k for k in topics if k in self.sources]
            for topic in want:
                if topic not in self._fresh:
                    self._now[topic] = self._version(topic, self.sources[topic])
                    self._fresh.add(topic)
            return {k: self._now[k] for k in want}, dict(self._html)

    def _markup(self, eid: str, fn: Callable[[], str]) -> str:
        try:
            text = fn()
            self._failed.discard(eid)
            return text
        except Exception:
            if eid not in self._failed:
                log.exception("page feed: the HTML of #%s failed", eid)
                self._failed.add(eid)
            return self._html.get(eid, "")

    def _version(self, topic: str, fn: Callable[[], object] | None) -> str:
        if fn is None:
            return str(int(time.time()))
        try:
            v = digest(fn())
            self._failed.discard(topic)
            return v
        except Exception:  # one topic's failure leaves the others live; logged once until it heals
            if topic not in self._failed:
                log.exception("page feed: the version of %s failed", topic)
                self._failed.add(topic)
            return "error"


class TopicStream(Protocol):
    """A shown tab's own part of one page's stream (the Telemetry tab's plot points): `poll()` → what to
    add to the next message ({"plot": ..., "html": {...}}), or None."""

    def poll(self) -> dict[str, object] | None: ...


class FeedRoute:
    """The ASGI app the gate serves at PATH: `text/event-stream`, one `data:` line of JSON per change:
    {"v": {topic: version}, "html": {element id: HTML}, ...}, each with only what moved since the last line.

    The query names the tab the page shows (`show=telemetry`) and that tab's settings (`window=15 min`): the
    HTML of elements of other tabs (`html_topics`) is not sent, and a shown tab with a stream (`streams`)
    adds its own part. The page opens a new stream when it shows another tab."""

    def __init__(self, versions: Versions, period_s: float = 1.0, html_topics: Mapping[str, str] | None = None,
                 streams: Mapping[str, Callable[[Mapping[str, str]], TopicStream]] | None = None) -> None:
        self.versions = versions
        self.period_s = period_s
        self.html_topics = dict(html_topics or {})
        self.streams = dict(streams or {})
        self.open = 0  # streams open now (tests: a page in the background holds none)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method", "GET") not in ("GET", "HEAD"):
            await send({"type": "http.response.start", "status": 405,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"allow", b"GET")]})
            await send({"type": "http.response.body", "body": b"GET only"})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                (b"cache-control", b"no-store"), (b"x-accel-buffering", b"no")]})
        if scope.get("method") == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            return
        query = {k: v[0] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1")).items() if v}
        show = query.get("show", "")
        wanted = {"header", show}
        stream = self.streams[show](query) if show in self.streams else None
        gone = asyncio.Event()
        alive: Callable[[], bool] = scope.get(SESSION_ALIVE) or (lambda: True)  # auth off: no session to end

        async def watch() -> None:
            while True:
                message: Message = await receive()
                if message.get("type") == "http.disconnect":
                    gone.set()
                    return

        watcher = asyncio.create_task(watch())
        self.open += 1
        sent: dict[str, str] = {}
        sent_html: dict[str, str] = {}
        quiet_since = time.monotonic()
        try:
            while not gone.is_set():
                if not alive():  # signed out (everywhere, or expired): the page's reconnect meets the login
                    break
                # every topic's version on the first line, then only the shown tab's (the page opens another
                # stream when it shows another tab); version functions may take a lock
                now, html = await asyncio.to_thread(self.versions.both, wanted if sent else None)
                changed = {k: v for k, v in now.items() if sent.get(k) != v}
                markup = {k: v for k, v in html.items()
                          if sent_html.get(k) != v and self.html_topics.get(k, "header") in wanted}
                extra = await asyncio.to_thread(stream.poll) if stream is not None else None
                if changed or markup or extra:
                    msg: dict[str, object] = {"v": changed, **(extra or {})}
                    msg["html"] = {**markup, **dict((extra or {}).get("html") or {})}  # type: ignore[call-overload]
                    line = json.dumps(msg, allow_nan=False)
                    await send({"type": "http.response.body", "body": f"data: {line}\n\n".encode(),
                                "more_body": True})
                    sent.update(changed)
                    sent_html.update(markup)
                    quiet_since = time.monotonic()
                elif time.monotonic() - quiet_since > KEEPALIVE_S:
                    await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
                    quiet_since = time.monotonic()
                try:
                    await asyncio.wait_for(gone.wait(), timeout=self.period_s)
                except asyncio.TimeoutError:
                    pass
        except OSError:  # the connection went away mid-send
            pass
        finally:
            watcher.cancel()
            self.open -= 1
        if not gone.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})


class AssetRoute:
    """A file of an installed package (the dygraphs library of Debian's libjs-dygraphs) served by the panel
    itself, same origin, so the page's CSP (script-src 'self') keeps remote scripts out. Public: a
    library file holds no data. Missing: a 404 that says which package to install."""

    def __init__(self, path: Path, content_type: str, package: str) -> None:
        self.path, self.content_type, self.package = path, content_type, package
        self._body: bytes | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._body is None:
            try:
                self._body = self.path.read_bytes()
            except OSError:
                body = (f"{self.path} is missing: install the Debian package {self.package} "
                        "(scripts/bootstrap.sh does)").encode()
                await send({"type": "http.response.start", "status": 404,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
                await send({"type": "http.response.body", "body": body})
                return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", self.content_type.encode()),
                                (b"cache-control", b"public, max-age=86400")]})
        await send({"type": "http.response.body", "body": self._body if scope.get("method") != "HEAD" else b""})
