"""Issue 42: the page feed (/moet/feed) is behind the gate like Gradio's own paths — a session with its key
when auth is on, the Host and Origin rules always — and the plot library (/moet/js/) is a public file."""

from __future__ import annotations

import httpx

from tests.security.test_web import login


def test_the_feed_needs_a_session_and_the_plot_library_does_not(authed) -> None:
    with httpx.Client(timeout=10) as c:
        r = c.get(authed.url + "/moet/feed")
        assert r.status_code == 401 and r.json()["detail"]["error"] == "Not authenticated"
        assert c.get(authed.url + "/moet/feed", headers={"Origin": "http://evil.example"}).status_code == 403
        lib = c.get(authed.url + "/moet/js/dygraph.min.js")
        assert lib.status_code == 200 and lib.headers["content-type"].startswith("text/javascript")
        assert "default-src 'self'" in lib.headers["content-security-policy"]
    with httpx.Client(timeout=10) as signed_in:
        login(signed_in, authed.url)
        with signed_in.stream("GET", authed.url + "/moet/feed?show=profiles") as s:
            assert s.status_code == 200 and s.headers["content-type"].startswith("text/event-stream")
            first = next(s.iter_lines())
            assert first.startswith("data: ") and '"v"' in first and "moet-header-live" in first
