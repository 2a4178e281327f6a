"""The panel's HTTP gate: one ASGI middleware in front of every route of the web app (Gradio's and
any other), in every mode. Policy and reasons: docs/ui-and-safety.md#the-http-gate.

In order, for each HTTP (and WebSocket) request:

1. **Host allow-list** — only the names the panel is bound to (`127.0.0.1`, `localhost`, `[::1]`
   with the port, the bind address) and the names the user configured for a reverse proxy are
   served; anything else is 421 (this is what defeats DNS rebinding).
2. **Forwarding headers** (`X-Forwarded-For`, `Forwarded`, ...) are refused unless a reverse proxy is
   configured: uvicorn believes them from 127.0.0.1, so any local process could otherwise pose as
   any client address (login throttling counts per address).
3. **Origin** — a request naming an `Origin` other than the panel's own exact origin is 403,
   CORS preflights included; without `Origin`, a browser's `Sec-Fetch-Site: cross-site|same-site`
   is 403 too, except a top-level page navigation (a link to the panel from elsewhere).
4. **Logout is POST only** (Gradio's own `/logout` is a GET: a state change any page could make).
5. **Unused Gradio features** (run history, proxy, vibe editing, monitoring, ...) are 404.
6. **Session** (auth on) — every path not on the short public list needs a signed-in session.
7. **Body size** — request bodies are capped (uploads higher than the rest).

Every response gets a Content-Security-Policy that keeps remote scripts, images, frames and
connections out of the page, plus no-frame/no-sniff/no-referrer/same-origin-resource headers.

No Gradio import here (app/backend/): the session check is a callable the UI layer supplies.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs, urlsplit

from app.backend import oplog

from app.backend.config import env
from app.backend.contracts import SESSION_ALIVE, ASGIApp, Message, Receive, Scope, Send
from app.backend.web.auth import LOGIN_NOTE, DeviceBook, LoginNote, SessionBook


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
FORWARDING_HEADERS = (b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto", b"forwarded", b"x-real-ip")
UPLOAD_PATHS = ("/gradio_api/upload",)
MAX_BODY_BYTES = 4 * 1024 * 1024  # every event's JSON: a 256 KiB chat message is far below it
MAX_UPLOAD_BYTES = 16 * 1024 * 1024  # a chat export to import (the panel's only upload)
# POST /login: a user name (at most 64 characters) and a password, URL-encoded. A login body is never
# buffered past this, so no typed name of a megabyte reaches the checker (issue 48)
MAX_LOGIN_BYTES = 8 * 1024

# Reachable without a session when auth is on. Each one, and why (docs/ui-and-safety.md#routes):
PUBLIC_EXACT = frozenset({
    "/",  # the login page (Gradio serves it without the app's config when nobody is signed in)
    "/login", "/login/",  # the login form posts here
    "/favicon.ico",
    "/theme.css", "/gradio_api/theme.css",  # the login page's styles
    "/gradio_api/startup-events",  # Gradio's launch() calls it itself, without a session; idempotent
})
PUBLIC_PREFIXES = ("/assets/", "/static/", "/svelte/")  # Gradio's built front-end files (no data)
# Gradio routes for features the panel does not use: 404 in every mode, whatever Gradio's own switch
# says (defence in depth: run history called the Hub with the panel's token; the proxy fetches URLs;
# vibe editing rewrites app code; monitoring, MCP, HLS recording, PWA and custom components).
UNUSED_PREFIXES = ("/gradio_api/run-history", "/gradio_api/runs", "/gradio_api/vibe-", "/gradio_api/undo-vibe-edit",
                   "/gradio_api/proxy=", "/gradio_api/dev/", "/gradio_api/mcp", "/gradio_api/process_recording",
                   "/gradio_api/custom_component/", "/monitoring", "/manifest.json", "/pwa_icon")

# What Gradio's page needs (checked in Chromium by tests/security/test_web.py): its inline boot
# script and inline styles, data:/blob: images (icons, uploads), its own origin for fetch/SSE.
CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
       "img-src 'self' data: blob:; font-src 'self' data:; media-src 'self' data: blob:; connect-src 'self'; "
       "worker-src 'self' blob:; frame-src 'none'; object-src 'none'; frame-ancestors 'none'; "
       "base-uri 'self'; form-action 'self'")
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-resource-policy", b"same-origin"),  # another site's <img>/<script> gets nothing
    (b"cross-origin-opener-policy", b"same-origin"),
)


# The session's second secret travels in this header (the page's fetch/XHR wrapper adds it), or in
# this query parameter on GET requests the page cannot add headers to (file links, images).
SESSION_HEADER = b"x-moet-session"
SESSION_QUERY = "moet_session"
DEVICE_HEADER = b"x-moet-device"
ISSUED_SESSION_HEADER = b"x-moet-session-key"  # on a successful POST /login only
ISSUED_DEVICE_HEADER = b"x-moet-device-key"
LOGIN_PATHS = ("/login", "/login/")
PAGE_PATHS = ("/",)  # Gradio's HTML page: the page script goes in here




@dataclass
class SessionGuard:
    """Auth on: what a signed-in session is (docs/ui-and-safety.md#sessions). Gradio's session cookie
    alone is not enough — cookies are per host, not per port (RFC 6265), so any page on another port
    of the same host receives it. A request is signed in only with the cookie's token AND that
    session's key, which the panel's page keeps in storage scoped to its origin (scheme, host and
    port) and sends in a header. Without both, the gate removes the cookie before Gradio sees the
    request (so Gradio serves its login page, never the app) and refuses every non-public path.

    `read_token(cookies)` → the token in Gradio's session cookie; `token_user(token)` → its user in
    Gradio's table; `forget(token)` drops it from that table; `page_script` is inserted at the top of
    the page's <head> (it keeps the keys and adds them to the page's requests)."""

    read_token: Callable[[dict[str, str]], str | None]
    token_user: Callable[[str], str | None]
    forget: Callable[[str], None]
    page_script: str = ""
    book: SessionBook = field(default_factory=SessionBook)
    devices: DeviceBook = field(default_factory=DeviceBook)
    cookie_prefix: str = "access-token-"

    def user(self, cookies: dict[str, str], key: str | None) -> str | None:
        token = self.read_token(cookies)
        user = self.book.user_of(token, key)
        if user is None or token is None:
            return None
        if self.token_user(token) != user:  # signed out through Gradio itself
            self.book.close_user(user)
            return None
        return user

    def sweep(self) -> None:
        for token in self.book.expired():
            self.forget(token)


def parse_allowed_hosts(text: str) -> tuple[str, ...]:
    """`a.example, b.example:8443` → normalised names; raises ValueError naming a bad entry."""
    out: list[str] = []
    for raw in text.split(","):
        name = raw.strip().lower()
        if not name:
            continue
        host, port = split_host(name)
        if not host or any(c in host for c in "/@?#* ") or (port is not None and not 0 < port < 65536):
            raise ValueError(f"allowed host {raw.strip()!r}: expected a host name, optionally with :PORT "
                             "(e.g. panel.example.com or panel.example.com:8443)")
        out.append(name)
    return tuple(out)


def split_host(value: str) -> tuple[str, int | None]:
    """`Host` header value → (host, port or None); IPv6 keeps its brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return "", None
        host, rest = value[: end + 1], value[end + 1 :]
    else:
        host, sep, rest = value.rpartition(":")
        if not sep:
            host, rest = value, ""
        else:
            rest = ":" + rest
    if not rest:
        return host, None
    if not rest.startswith(":") or not rest[1:].isascii() or not rest[1:].isdigit():
        return "", None
    return host, int(rest[1:])


@dataclass(frozen=True)
class GatePolicy:
    """What the gate lets through; `sessions` is None when auth is off."""

    port: int
    bind_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()  # reverse-proxy names (parse_allowed_hosts)
    sessions: SessionGuard | None = None  # None: auth is off (loopback only, see auth.check_binding)
    auth_message: str = ""
    # Routes the gate serves itself, in front of Gradio, after the Host/forwarding/Origin checks; each
    # does its own access check (no session: e.g. /metrics and its bearer token, docs/metrics.md).
    routes: tuple[tuple[str, ASGIApp], ...] = ()
    # Routes the gate serves itself for the panel's own page (the page feed, app/backend/web/pagefeed.py): every
    # check applies, the session too, as to Gradio's own paths.
    page_routes: tuple[tuple[str, ASGIApp], ...] = ()
    on_refusal: Callable[[int], None] | None = None  # told each refusal's status (the /metrics counters)
    # Inserted first in the page's <head>, auth on or off: runs before Gradio's own modules (Gradio adds its
    # `head` setting only once the app is mounted; assets/js/idle-frames.js must come earlier, issue 49).
    page_script: str = ""
    fn_index_ok: Callable[[int], bool] | None = None  # does this fn_index name an event? (None: unchecked)
    max_body_bytes: int = MAX_BODY_BYTES
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    max_login_bytes: int = MAX_LOGIN_BYTES
    _exact: frozenset[str] = field(init=False, repr=False, default=frozenset())

    def __post_init__(self) -> None:
        names = {f"{n}:{self.port}" for n in LOOPBACK_NAMES}
        if self.port == 80:
            names |= set(LOOPBACK_NAMES)
        bind = self.bind_host.strip().lower()
        try:
            addr = ipaddress.ip_address(bind.strip("[]"))
            if not addr.is_unspecified:  # 0.0.0.0 / :: name no host; configure --allowed-host
                names.add(f"[{addr}]:{self.port}" if addr.version == 6 else f"{addr}:{self.port}")
            elif addr.version == 6:  # Gradio's own start-up request on a `::` bind (an IP literal: no rebinding)
                names.add(f"[::]:{self.port}")
        except ValueError:
            if bind:
                names.add(f"{bind}:{self.port}")
        object.__setattr__(self, "_exact", frozenset(names))

    @property
    def behind_proxy(self) -> bool:
        return bool(self.allowed_hosts)

    def host_allowed(self, host_header: str) -> bool:
        value = host_header.strip().lower()
        if value in self._exact:
            return True
        host, port = split_host(value)
        for name in self.allowed_hosts:
            n_host, n_port = split_host(name)
            if host == n_host and (n_port is None or n_port == port):
                return True
        return False

    def served_names(self) -> list[str]:
        return sorted(self._exact) + list(self.allowed_hosts)

    def body_limit(self, path: str) -> int:
        """The most bytes a request body of this route may have (docs/ui-and-safety.md#the-http-gate)."""
        if path in LOGIN_PATHS:
            return self.max_login_bytes
        return self.max_upload_bytes if path.startswith(UPLOAD_PATHS) else self.max_body_bytes


def _headers(scope: Scope) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for k, v in scope.get("headers", []):
        out[k.lower()] = v if k.lower() not in out else out[k.lower()] + b", " + v
    return out


def _cookies(raw: bytes) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw.decode("latin-1"))
    except CookieError:  # a malformed Cookie header means no session, not a crash
        return {}
    return {k: m.value for k, m in jar.items()}


def is_unused(path: str) -> bool:
    return path.startswith(UNUSED_PREFIXES)


def is_public(path: str) -> bool:
    return path in PUBLIC_EXACT or path.startswith(PUBLIC_PREFIXES)


FN_INDEX_PATHS = ("/gradio_api/queue/join", "/gradio_api/run/", "/gradio_api/api/")


class WebGate:
    """ASGI middleware applying GatePolicy (module docstring) before anything else runs."""

    def __init__(self, app: ASGIApp, policy: GatePolicy):
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        note_token = LOGIN_NOTE.set(None)
        try:
            user = self._signed_in(scope)
            refusal = self._refusal(scope, user)
            if refusal is not None:
                status, body, extra = refusal
                if self.policy.on_refusal is not None:
                    self.policy.on_refusal(status)
                if kind == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await _respond(send, status, body, extra)
                return
            if self.policy.sessions is not None and user is None:
                scope = _without_cookie(scope)  # Gradio sees a visitor, never the session (SessionGuard)
            path = scope.get("path", "")
            if kind == "http" and path.rstrip("/") == "/logout":
                scope = dict(scope, method="GET")  # Gradio's handler is a GET; only a POST reaches it
            if kind == "http":
                receive = self._capped(scope, receive)
                if scope.get("method") == "POST" and path.startswith(FN_INDEX_PATHS) and self.policy.fn_index_ok:
                    receive, bad = await self._fn_index_checked(receive)
                    if bad:
                        await _respond(send, 422, bad, [])
                        return
                send = _with_security_headers(send)
                send = self._session_send(scope, send, user)
                if self.policy.page_script and path in PAGE_PATHS and scope.get("method") == "GET":
                    send = _page_send(send, self.policy.page_script)
            served = dict(self.policy.routes + self.policy.page_routes)
            if user is not None and kind == "http":
                # a long-lived answer (the page feed) ends when its session does (signed out everywhere,
                # expired): the page's next request then gets 401 and it shows the login form at once. The
                # check counts as the page's activity, as its polling did: a shown page keeps its session
                signed = scope
                scope = dict(scope, **{SESSION_ALIVE: lambda: self._signed_in(signed) == user})
            await served.get(scope.get("path", ""), self.app)(scope, receive, send)
        finally:
            LOGIN_NOTE.reset(note_token)

    # ---- sessions (auth on) ------------------------------------------------------------------

    def _signed_in(self, scope: Scope) -> str | None:
        """The user of the request's session when it carries both the cookie and the session key."""
        guard = self.policy.sessions
        if guard is None:
            return None
        headers = _headers(scope)
        key = headers.get(SESSION_HEADER, b"").decode("latin-1") or None
        if key is None and scope.get("method", "GET") in ("GET", "HEAD") and scope["type"] == "http":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            key = (query.get(SESSION_QUERY) or [None])[0]
        guard.sweep()
        return guard.user(_cookies(headers.get(b"cookie", b"")), key)

    def _session_send(self, scope: Scope, send: Send, user: str | None) -> Send:
        """Per-route work on the answer: the login's outcome, the page script, sign-out everywhere."""
        guard = self.policy.sessions
        if guard is None:
            return send
        path, method = scope.get("path", ""), scope.get("method", "GET")
        if path in LOGIN_PATHS and method == "POST":
            headers = _headers(scope)
            client = scope.get("client")
            device = headers.get(DEVICE_HEADER, b"").decode("latin-1") or None
            note = LoginNote(address=str(client[0]) if client else "", device=device,
                             device_user=guard.devices.user_of(device))
            LOGIN_NOTE.set(note)
            return _login_send(send, guard, note)
        if path in PAGE_PATHS and method == "GET" and guard.page_script:
            return _page_send(send, guard.page_script)
        if path.rstrip("/") == "/logout" and user is not None:
            async def logout_send(message: Message) -> None:
                if message.get("type") == "http.response.start" and message.get("status", 500) < 400:
                    closed = guard.book.close_user(user)
                    for token in closed:  # every session of this user: everywhere
                        guard.forget(token)
                    oplog.decision("auth", "logout", who=oplog.user(user), sessions_closed=len(closed))
                await send(message)
            return logout_send
        return send

    async def _fn_index_checked(self, receive: Receive) -> tuple[Receive, str]:
        """Read the (capped) body of an event call; a `fn_index` that names no event is a 422 here,
        not Gradio's KeyError (a 500). Returns a receive that replays the body."""
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message.get("type") != "http.request":
                return _replay([message]), ""
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        try:
            doc = json.loads(body) if body else {}
        except ValueError:
            doc = {}
        index = doc.get("fn_index") if isinstance(doc, dict) else None
        check = self.policy.fn_index_ok
        if index is not None and check is not None and (
                isinstance(index, bool) or not isinstance(index, int) or not check(index)):
            return _replay([]), f"fn_index {index!r} names no event of this panel."
        return _replay([{"type": "http.request", "body": body, "more_body": False}]), ""

    # ---- refusals ----------------------------------------------------------------------------

    def _refusal(self, scope: Scope, user: str | None) -> tuple[int, str | dict[str, object], list[tuple[bytes, bytes]]] | None:
        p = self.policy
        headers = _headers(scope)
        host = headers.get(b"host", b"").decode("latin-1")
        if not p.host_allowed(host):
            return 421, (f"moet-panel answers only to {', '.join(p.served_names())}, not to the host name "
                         f"{host or '(none)'!r}. If you reach it through a reverse proxy or another name, start it "
                         f"with --allowed-host NAME (env {env.ALLOWED_HOSTS}); see README, Safety."), []
        if not p.behind_proxy and any(h in headers for h in FORWARDING_HEADERS):
            return 400, ("moet-panel is not configured behind a reverse proxy, so it refuses forwarding headers "
                         "(X-Forwarded-For, Forwarded, ...): they would let any local process pose as another "
                         "client. Behind a proxy, start with --allowed-host NAME."), []
        origin = headers.get(b"origin")
        if origin is not None:
            o = urlsplit(origin.decode("latin-1"))
            if o.scheme not in ("http", "https") or o.netloc.lower() != host.strip().lower():
                return 403, (f"moet-panel refuses requests made by another site's page (Origin "
                             f"{origin.decode('latin-1')!r}; this panel is {host!r})."), []
        else:
            site = headers.get(b"sec-fetch-site", b"").decode("latin-1").lower()
            if site in ("cross-site", "same-site"):
                navigation = (scope.get("method") in ("GET", "HEAD")
                              and headers.get(b"sec-fetch-mode") == b"navigate"
                              and headers.get(b"sec-fetch-dest") == b"document")
                if not navigation:
                    return 403, "moet-panel refuses requests made by another site's page.", []
        path = scope.get("path", "")
        if is_unused(path):
            return 404, "not found (a Gradio feature moet-panel does not use; docs/ui-and-safety.md#routes)", []
        if scope["type"] == "http" and path.rstrip("/") == "/logout" and scope.get("method") != "POST":
            return 405, "log out with POST /logout (a GET cannot change anything here).", [(b"allow", b"POST")]
        if p.sessions is not None and not is_public(path) and path not in dict(p.routes) and user is None:
            # Gradio's own 401 body, so its page shows the login form.
            return 401, {"detail": {"error": "Not authenticated", "auth_message": p.auth_message}}, []
        if scope["type"] == "http":
            limit = p.body_limit(path)
            length = headers.get(b"content-length", b"")
            if length.isdigit() and int(length) > limit:
                return 413, (f"request body of {int(length)} bytes is over this route's limit of {limit} bytes "
                             "(docs/ui-and-safety.md#the-http-gate)."), []
        return None

    def _capped(self, scope: Scope, receive: Receive) -> Receive:
        """A body without Content-Length (chunked) is cut off at the limit: the app sees a disconnect."""
        limit = self.policy.body_limit(scope.get("path", ""))
        seen = 0

        async def capped() -> Message:
            nonlocal seen
            message = await receive()
            if message.get("type") == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    return {"type": "http.disconnect"}
            return message

        return capped


def _replay(messages: list[Message]) -> Receive:
    queue = list(messages)

    async def receive() -> Message:
        if queue:
            return queue.pop(0)
        return {"type": "http.disconnect"}

    return receive


def _without_cookie(scope: Scope) -> Scope:
    return dict(scope, headers=[(k, v) for k, v in scope.get("headers", []) if k.lower() != b"cookie"])


def _login_send(send: Send, guard: SessionGuard, note: LoginNote) -> Send:
    """POST /login's answer: on success, the session key and a device key for the page (headers the
    page script stores) and cookies with Max-Age; a throttled login becomes 429 (503 when busy)
    with Retry-After, and a login refused for its form (a user name too long) a 400 saying why,
    instead of Gradio's 400."""
    swallow = False

    async def wrapped(message: Message) -> None:
        nonlocal swallow
        if message.get("type") == "http.response.start":
            status = message.get("status", 500)
            if status == 400 and note.invalid:
                swallow = True
                await _respond(send, 400, note.invalid, [])
                return
            if status == 400 and (note.refused or note.busy):
                swallow = True
                wait = max(1, int(note.retry_after_s + 0.999))
                text = (f"Too many sign-in attempts for now; try again in {wait} s." if note.refused else
                        "The panel is checking too many sign-ins at once; try again in a moment.")
                await _respond(send, 429 if note.refused else 503, text, [(b"retry-after", str(wait).encode())])
                return
            if status == 200:
                headers = list(message.get("headers", []))
                token = None
                out: list[tuple[bytes, bytes]] = []
                for k, v in headers:
                    if k.lower() == b"set-cookie":
                        name, _, rest = v.decode("latin-1").partition("=")
                        if name.startswith(guard.cookie_prefix):
                            token = rest.split(";", 1)[0]
                            v = _cookie_with_limits(v.decode("latin-1"), int(guard.book.lifetime_s)).encode("latin-1")
                    out.append((k, v))
                user = guard.token_user(token) if token else None
                if token and user:
                    out.append((ISSUED_SESSION_HEADER, guard.book.open(token, user).encode()))
                    out.append((ISSUED_DEVICE_HEADER, guard.devices.issue(user).encode()))
                out.append((b"cache-control", b"no-store"))
                message = dict(message, headers=out)
        elif swallow:
            return
        await send(message)

    return wrapped


def _cookie_with_limits(cookie: str, max_age: int) -> str:
    """Gradio's session cookie with a Max-Age (the session's absolute lifetime) and SameSite=Strict."""
    parts = [p.strip() for p in cookie.split(";")]
    parts = [p for p in parts if not p.lower().startswith(("max-age", "expires", "samesite"))]
    return "; ".join([*parts, f"Max-Age={max_age}", "SameSite=strict"])


def _page_send(send: Send, script: str) -> Send:
    """Gradio's HTML page with the page script first in <head>, before Gradio's own scripts."""
    tag = f"<script>{script}</script>".encode()
    start: Message | None = None
    chunks: list[bytes] = []

    async def wrapped(message: Message) -> None:
        nonlocal start
        if message.get("type") == "http.response.start":
            ctype = dict((k.lower(), v) for k, v in message.get("headers", [])).get(b"content-type", b"")
            if message.get("status") == 200 and ctype.startswith(b"text/html"):
                start = message
                return
            await send(message)
            return
        if start is None or message.get("type") != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body = b"".join(chunks).replace(b"<head>", b"<head>" + tag, 1)
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await send(dict(start, headers=headers))
        await send({"type": "http.response.body", "body": body})

    return wrapped


def _with_security_headers(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message.get("type") == "http.response.start":
            names = {k.lower() for k, _ in message.get("headers", [])}
            message["headers"] = [*message.get("headers", []),
                                  *((k, v) for k, v in SECURITY_HEADERS if k not in names)]
        await send(message)

    return wrapped


async def _respond(send: Send, status: int, body: str | dict[str, object], extra: list[tuple[bytes, bytes]]) -> None:
    if isinstance(body, str):
        data, ctype = (body + "\n").encode(), b"text/plain; charset=utf-8"
    else:
        data, ctype = json.dumps(body).encode(), b"application/json"
    headers = [(b"content-type", ctype), (b"content-length", str(len(data)).encode()),
               (b"cache-control", b"no-store"), *SECURITY_HEADERS, *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
