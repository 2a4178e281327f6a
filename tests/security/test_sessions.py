"""Issue 30, finding 1 (high): a signed-in session walked out to any other loopback port, because
cookies are per host, not per port (RFC 6265). Now a session is the cookie AND a key the panel's page
keeps in origin-scoped storage (app/backend/web/gate.py SessionGuard, assets/js/session-key.js);
sessions expire on the server; sign-out ends them everywhere. docs/ui-and-safety.md#sessions."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.backend.web.auth import SessionBook

from tests.security.conftest import PASSWORD


class CookieCatcher:
    """A page on another loopback port that records the Cookie header every request brings."""

    def __init__(self) -> None:
        self.cookies: list[str] = []
        seen = self.cookies

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                seen.append(self.headers.get("Cookie") or "")
                body = b"<html><body>an innocent page on another port</body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def jar(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for header in self.cookies:
            for part in header.split(";"):
                name, sep, value = part.strip().partition("=")
                if sep:
                    out[name] = value
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def tmp_path_of(panel: Any) -> Path:
    return Path(panel.data_dir).parent


def sign_in(page: Any, url: str) -> None:
    page.goto(url)
    page.get_by_label("username", exact=False).fill("alice")
    page.get_by_label("password", exact=False).fill(PASSWORD)
    page.get_by_role("button", name="Login").click()
    page.wait_for_selector("#profile-cards")


def run_an_event(page: Any, label: str, profile: str, flag: str) -> None:
    page.get_by_label(label, exact=True).check()
    page.locator(f'.moet-card.selected[data-profile="{profile}"]').wait_for()
    page.wait_for_function(f"() => document.querySelector('#profile-command textarea').value.includes('{flag}')")


def replay_everything(url: str, cookies: dict[str, str], file_url: str) -> dict[str, tuple[int, str]]:
    """What a thief holding the cookies can do: every interesting route, with the cookies only."""
    out: dict[str, tuple[int, str]] = {}
    with httpx.Client(timeout=30, cookies=cookies, follow_redirects=False) as c:
        for path in ("/config", "/gradio_api/info", "/gradio_api/token", "/gradio_api/user", "/robots.txt",
                     "/gradio_api/heartbeat/x", "/gradio_api/queue/data?session_hash=x", file_url):
            r = c.get(url + path)
            out["GET " + path] = (r.status_code, r.text)
        for path, body in (("/gradio_api/queue/join", {"data": [], "fn_index": 0, "session_hash": "thief"}),
                           ("/gradio_api/cancel", {"session_hash": "thief", "fn_index": 0, "event_id": "x"}),
                           ("/logout", None)):
            r = c.post(url + path, json=body)
            out["POST " + path] = (r.status_code, r.text)
        r = c.post(url + "/gradio_api/upload", files={"files": ("x.json", b"{}", "application/json")})
        out["POST /gradio_api/upload"] = (r.status_code, r.text)
        page = c.get(url + "/")  # the page shell only: Gradio sees no session, so no app config
        out["GET /"] = (page.status_code, page.text)
    return out


@pytest.mark.browser
@pytest.mark.slow
def test_cookies_sent_to_another_loopback_port_open_nothing(authed, browser) -> None:
    page = browser.new_page(1280, 800)
    sign_in(page, authed.url)
    run_an_event(page, "#3 max speed", "speed", "DELTA_POLICY=need")
    catcher = CookieCatcher()
    try:
        other = page.context.new_page()
        other.goto(catcher.url)  # e.g. a malicious site's redirect to a local port
        stolen = catcher.jar()
    finally:
        catcher.close()
    assert any(k.startswith("access-token-") for k in stolen), stolen  # the browser did send them (RFC 6265)
    # (a real exported file's link: test_a_file_the_page_links_is_bound_to_the_session_too)
    results = replay_everything(authed.url, stolen, "/gradio_api/file=/nonexistent")
    for what, (status, text) in results.items():
        if what == "GET /":
            assert status == 200 and '"auth_required":true' in text.replace(" ", ""), text[:300]
            assert "profile-cards" not in text and "VLLM_MOE_W2" not in text and "DELTA_POLICY" not in text
            continue
        assert status in (401, 403), (what, status, text[:200])
        assert "DELTA_POLICY" not in text and "profile-cards" not in text, what
    # The owner's page keeps working: an event runs, and a reload (a navigation: cookies only) comes back signed in.
    run_an_event(page, "#1 max quality", "quality", "DELTA_POLICY=freq")
    assert not browser.console_errors, browser.console_errors
    page.reload()  # (the reload aborts the old page's streams: Gradio logs that as errors)
    page.wait_for_selector("#profile-cards")
    browser.console_errors.clear()
    run_an_event(page, "#3 max speed", "speed", "DELTA_POLICY=need")
    assert page.evaluate("async () => (await fetch('/config')).status") == 200
    assert not browser.console_errors, browser.console_errors


@pytest.mark.browser
@pytest.mark.slow
def test_sign_out_everywhere_ends_every_session_of_the_user(authed, browser) -> None:
    first, second = browser.new_page(), browser.new_page()  # two browsers (separate contexts)
    sign_in(first, authed.url)
    sign_in(second, authed.url)
    first.get_by_role("button", name="Sign out everywhere").click()
    first.get_by_role("button", name="Login").wait_for()
    # The other browser's next request (the page polls every second) is refused: back to the login form.
    second.get_by_role("button", name="Login").wait_for()
    second.reload()
    second.get_by_role("button", name="Login").wait_for()
    assert authed.blocks.server_app.tokens == {}


def test_sessions_expire_on_the_server_idle_and_absolute() -> None:
    now = [1000.0]
    book = SessionBook(idle_s=60, lifetime_s=300, clock=lambda: now[0])
    key = book.open("tok", "alice")
    assert book.user_of("tok", key) == "alice"
    assert book.user_of("tok", "wrong-key") is None and book.user_of("tok", None) is None
    now[0] += 61
    assert book.user_of("tok", key) is None  # idle too long
    key = book.open("tok2", "alice")
    for _ in range(6):  # busy all the time, but the absolute lifetime still ends it
        now[0] += 50
        assert book.user_of("tok2", key) == "alice"
    now[0] += 50
    assert book.user_of("tok2", key) is None


def test_login_cookies_carry_max_age_and_a_key_only_for_the_page(authed) -> None:
    with httpx.Client(timeout=30) as c:
        r = c.post(authed.url + "/login", data={"username": "alice", "password": PASSWORD})
        assert r.status_code == 200
        cookies = r.headers.get_list("set-cookie")
        assert cookies and all("Max-Age=86400" in v and "SameSite=strict" in v for v in cookies), cookies
        key = r.headers["x-moet-session-key"]
        assert c.get(authed.url + "/config").status_code == 401  # the cookie alone
        assert c.get(authed.url + "/config", headers={"X-Moet-Session": key}).status_code == 200
        assert c.get(authed.url + "/config", headers={"X-Moet-Session": key[:-2] + "xx"}).status_code == 401
    with httpx.Client(timeout=30) as other:  # the key without the cookie is nothing either
        assert other.get(authed.url + "/config", headers={"X-Moet-Session": key}).status_code == 401


@pytest.mark.browser
@pytest.mark.slow
def test_a_file_the_page_links_is_bound_to_the_session_too(authed, browser) -> None:
    """`<a href=/gradio_api/file=…>` is a request the page makes without script control: the page
    script puts the session key in such links; the cookies alone fetch nothing."""
    import json

    conv = {"format": "moet-panel.chat", "version": 1, "conversation": {
        "id": "filecheck", "title": "file check", "messages": [
            {"role": "user", "content": "hello"}, {"role": "assistant", "content": "the secret answer 4711"}]}}
    authed.state.chat.import_json(json.dumps(conv))
    page = browser.new_page()
    sign_in(page, authed.url)
    page.get_by_role("tab", name="Chat").click()
    page.locator("#chat-bot", has_text="the secret answer 4711").wait_for()
    page.locator("#chat-export-md").click()
    link = page.locator('#chat-export-file a[href*="/gradio_api/file="]').first
    link.wait_for()
    href = link.get_attribute("href")
    assert "moet_session=" in href, href  # the page script bound the link
    got = page.evaluate("async (u) => { const r = await fetch(u); return [r.status, await r.text()]; }", href)
    assert got[0] == 200 and "the secret answer 4711" in got[1], got
    with page.expect_download() as info:  # the owner's click on the link downloads it
        link.click()
    assert "the secret answer 4711" in Path(info.value.path()).read_text()
    # An upload (the chat import) goes through the page's fetch, with the key: it works for the owner.
    again = tmp_path_of(authed) / "import-me.json"
    conv["conversation"].update(id="uploaded", title="uploaded through the page")
    again.write_text(json.dumps(conv))
    with page.expect_file_chooser() as chooser:
        page.locator("#chat-import").click()
    chooser.value.set_files(str(again))
    page.get_by_text("uploaded through the page").first.wait_for()
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    bare = href.split("?")[0]
    with httpx.Client(timeout=30, cookies=cookies) as thief:
        r = thief.get(bare if bare.startswith("http") else authed.url + bare)
        assert r.status_code == 401 and "4711" not in r.text


@pytest.mark.browser
@pytest.mark.slow
def test_during_a_guessing_flood_the_owners_browser_still_signs_in(authed, browser) -> None:
    """The device key (origin-scoped storage, like the session key) lets the browser that signed in
    before through at once while someone floods the account; a new browser is told to wait."""
    from concurrent.futures import ThreadPoolExecutor

    owner = browser.new_page()
    sign_in(owner, authed.url)
    owner.get_by_role("button", name="Sign out everywhere").click()
    owner.get_by_role("button", name="Login").wait_for()

    def guess(n: int) -> int:
        with httpx.Client(timeout=120, transport=httpx.HTTPTransport(local_address=f"127.0.1.{n + 2}")) as c:
            return c.post(authed.url + "/login", data={"username": "alice", "password": f"guess-{n}"}).status_code

    stranger = browser.new_page()  # a browser that never signed in, its form filled in before the flood
    stranger.goto(authed.url)
    for page in (stranger, owner):
        page.get_by_label("username", exact=False).fill("alice")
        page.get_by_label("password", exact=False).fill(PASSWORD)
    with ThreadPoolExecutor(40) as pool:
        flood = [pool.submit(guess, n) for n in range(40)]
        deadline = time.monotonic() + 60  # the account's queue is full once the first guess is refused
        while not any(f.done() and f.result() == 429 for f in flood):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with stranger.expect_response(lambda r: r.url.endswith("/login")) as resp:
            stranger.get_by_role("button", name="Login").click()
        assert resp.value.status == 429
        stranger.get_by_role("alert").filter(has_text="try again in").wait_for()
        owner.get_by_role("button", name="Login").click()
        owner.wait_for_selector("#profile-cards", timeout=15_000)
        assert {f.result() for f in flood} <= {400, 429, 503}


def test_the_gate_has_a_place_for_routes_with_their_own_check() -> None:
    """Gate-served routes (e.g. /metrics with its own token) skip the session check, nothing else."""
    from app.backend.web.gate import GatePolicy, SessionGuard, WebGate

    async def gradio(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"gradio"})

    async def metrics(scope: Any, receive: Any, send: Any) -> None:
        ok = dict(scope["headers"]).get(b"authorization") == b"Bearer t"
        await send({"type": "http.response.start", "status": 200 if ok else 401, "headers": []})
        await send({"type": "http.response.body", "body": b"metrics" if ok else b"no"})

    refused: list[int] = []
    guard = SessionGuard(read_token=lambda c: None, token_user=lambda t: None, forget=lambda t: None)
    gate = WebGate(gradio, GatePolicy(port=7860, sessions=guard, routes=(("/metrics", metrics),),
                                      on_refusal=refused.append))

    async def go() -> list[tuple[int, str]]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://127.0.0.1:7860") as c:
            out = []
            for path, headers in (("/metrics", {"Authorization": "Bearer t"}), ("/metrics", {}), ("/config", {}),
                                  ("/metrics", {"Origin": "http://127.0.0.1:9999"})):
                r = await c.get(path, headers=headers)
                out.append((r.status_code, r.text))
            return out

    from concurrent.futures import ThreadPoolExecutor
    import asyncio

    with ThreadPoolExecutor(1) as pool:
        got = pool.submit(asyncio.run, go()).result()
    assert got[0] == (200, "metrics") and got[1][0] == 401 and got[2][0] == 401 and got[3][0] == 403
    assert refused == [401, 403]  # the gate's own refusals (the route's own 401 is its business)
