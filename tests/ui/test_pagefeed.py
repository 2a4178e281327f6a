"""The page feed (app/backend/web/pagefeed.py, issue 42): every version once, then only what moved, nothing
while nothing changes; a tab's HTML only to a page showing that tab; one failing topic leaves the others."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.aio import run_async
from app.backend.web.pagefeed import FeedRoute, Versions


def run_feed(route: FeedRoute, query: bytes, steps: list[Any]) -> list[dict[str, Any]]:
    """Serve one stream; before each of the route's periods, the next step (a callable) runs; then the page
    goes away. Returns the data lines sent."""
    sent: list[bytes] = []

    async def main() -> None:
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                sent.append(message["body"])

        task = asyncio.create_task(route({"type": "http", "method": "GET", "query_string": query}, receive, send))
        for step in steps:
            step()
            n = versions_computed(route)
            while versions_computed(route) == n:  # one more period of the route
                await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        gone.set()
        await asyncio.wait_for(task, 5)

    run_async(main)
    return [json.loads(b.decode()[len("data: "):]) for b in sent if b.startswith(b"data: ")]


def versions_computed(route: FeedRoute) -> int:
    return route.versions.computed


def test_every_version_once_then_only_what_moved_and_nothing_when_idle() -> None:
    values = {"header": "a", "engine": 1, "logs": 1}
    versions = Versions({k: (lambda k=k: values[k]) for k in values}, period_s=0.0)
    route = FeedRoute(versions, period_s=0.01)

    def move() -> None:
        values["engine"] = 2

    idle = [lambda: None] * 5
    lines = run_feed(route, b"show=engine", [*idle, move, *idle])
    assert len(lines) == 2, lines  # the first line, then the one change: nothing in the idle periods
    assert set(lines[0]["v"]) == {"header", "engine", "logs"}
    assert set(lines[1]["v"]) == {"engine"}


def test_after_the_first_line_only_the_shown_tabs_version_is_computed() -> None:
    """Issue 49: a hidden tab's version is of no use to the page (it opens another stream when it shows that
    tab), and some cost milliseconds: after a stream's first line (every topic), only the shown tab's."""
    calls = {"engine": 0, "service": 0}

    def counted(k: str) -> object:
        calls[k] += 1
        return 1

    versions = Versions({k: (lambda k=k: counted(k)) for k in calls}, period_s=0.0)
    route = FeedRoute(versions, period_s=0.01)
    lines = run_feed(route, b"show=engine", [lambda: None] * 5)
    assert set(lines[0]["v"]) == {"engine", "service"}
    assert calls["service"] == 1 and calls["engine"] >= 5, calls


def test_a_tabs_html_goes_only_to_a_page_showing_it() -> None:
    versions = Versions({}, period_s=0.0, html={"moet-header-live": lambda: "<b>h</b>", "telemetry-details-live": lambda: "d"})
    route = FeedRoute(versions, period_s=0.01, html_topics={"moet-header-live": "header",
                                                             "telemetry-details-live": "telemetry"})
    on_profiles = run_feed(route, b"show=profiles", [lambda: None])
    assert on_profiles[0]["html"] == {"moet-header-live": "<b>h</b>"}
    on_telemetry = run_feed(route, b"show=telemetry", [lambda: None])
    assert set(on_telemetry[0]["html"]) == {"moet-header-live", "telemetry-details-live"}


def test_one_failing_topic_leaves_the_others_live() -> None:
    def broken() -> object:
        raise RuntimeError("boom")

    v = Versions({"engine": lambda: 1, "access": broken}, period_s=0.0)
    now = v.now()
    assert now["access"] == "error" and len(now["engine"]) == 16


def test_the_stream_ends_when_its_session_does() -> None:
    """Signed out everywhere (or expired): the open stream ends by itself, so the page's reconnect meets the gate's
    401 and the page shows the login form (assets/js/session-key.js) instead of staying open unnoticed."""
    from app.backend.contracts import SESSION_ALIVE

    values = {"header": 1}
    versions = Versions({"header": lambda: values["header"]}, period_s=0.0)
    route = FeedRoute(versions, period_s=0.01)
    signed = {"in": True}
    ended: list[bool] = []

    async def main() -> None:
        async def receive() -> dict[str, Any]:
            await asyncio.Event().wait()  # the page never goes away by itself
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("more_body") is False:
                ended.append(True)

        scope = {"type": "http", "method": "GET", "query_string": b"", SESSION_ALIVE: lambda: signed["in"]}
        task = asyncio.create_task(route(scope, receive, send))
        await asyncio.sleep(0.05)
        assert not task.done() and route.open == 1  # signed in: the stream stays open
        signed["in"] = False
        await asyncio.wait_for(task, 5)  # ends within a period, with no disconnect from the page

    run_async(main)
    assert ended == [True] and route.open == 0
