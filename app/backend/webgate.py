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
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import urlsplit

from app.backend import env

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
FORWARDING_HEADERS = (b"x-forwarded-for", b"x-forwarded-host", b"x-forwarded-proto", b"forwarded", b"x-real-ip")
UPLOAD_PATHS = ("/gradio_api/upload",)
MAX_BODY_BYTES = 4 * 1024 * 1024  # every event's JSON: a 256 KiB chat message is far below it
MAX_UPLOAD_BYTES = 16 * 1024 * 1024  # a chat export to import (the panel's only upload)

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

# The client address of the request being handled (auth.py's throttle counts per address).
CLIENT_ADDRESS: ContextVar[str] = ContextVar("moet_panel_client_address", default="")


def current_client() -> str:
    """The client address of the request in progress ('' outside a request)."""
    return CLIENT_ADDRESS.get()


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
    """What the gate lets through. `session_user(cookies)` → the signed-in user or None; None as the
    callable itself means auth is off (loopback only, see auth.check_binding)."""

    port: int
    bind_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()  # reverse-proxy names (parse_allowed_hosts)
    session_user: Callable[[dict[str, str]], str | None] | None = None
    auth_message: str = ""
    max_body_bytes: int = MAX_BODY_BYTES
    max_upload_bytes: int = MAX_UPLOAD_BYTES
    # Routes the gate serves itself, in front of Gradio, after the Host/forwarding/Origin checks; each
    # does its own access check (no session: e.g. /metrics and its bearer token, docs/metrics.md).
    routes: tuple[tuple[str, ASGIApp], ...] = ()
    on_refusal: Callable[[int], None] | None = None  # told each refusal's status (the /metrics counters)
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


def _headers(scope: Scope) -> dict[bytes, bytes]:
    out: dict[bytes, bytes] = {}
    for k, v in scope.get("headers", []):
        out[k.lower()] = v if k.lower() not in out else out[k.lower()] + b", " + v
    return out


def _cookies(raw: bytes) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(raw.decode("latin-1"))
    except Exception:  # a malformed Cookie header means no session, not a crash
        return {}
    return {k: m.value for k, m in jar.items()}


def is_unused(path: str) -> bool:
    return path.startswith(UNUSED_PREFIXES)


def is_public(path: str) -> bool:
    return path in PUBLIC_EXACT or path.startswith(PUBLIC_PREFIXES)


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
        client = scope.get("client")
        token = CLIENT_ADDRESS.set(str(client[0]) if client else "")
        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                status, body, extra = refusal
                if self.policy.on_refusal is not None:
                    self.policy.on_refusal(status)
                if kind == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                await _respond(send, status, body, extra)
                return
            if kind == "http" and scope.get("path", "").rstrip("/") == "/logout":
                scope = dict(scope, method="GET")  # Gradio's handler is a GET; only a POST reaches it
            if kind == "http":
                receive = self._capped(scope, receive)
                send = _with_security_headers(send)
            await dict(self.policy.routes).get(scope.get("path", ""), self.app)(scope, receive, send)
        finally:
            CLIENT_ADDRESS.reset(token)

    def _refusal(self, scope: Scope) -> tuple[int, Any, list[tuple[bytes, bytes]]] | None:
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
        if p.session_user is not None and not is_public(path) and path not in dict(p.routes):
            if p.session_user(_cookies(headers.get(b"cookie", b""))) is None:
                # Gradio's own 401 body, so its page shows the login form.
                return 401, {"detail": {"error": "Not authenticated", "auth_message": p.auth_message}}, []
        if scope["type"] == "http":
            limit = p.max_upload_bytes if path.startswith(UPLOAD_PATHS) else p.max_body_bytes
            length = headers.get(b"content-length", b"")
            if length.isdigit() and int(length) > limit:
                return 413, (f"request body of {int(length)} bytes is over this route's limit of {limit} bytes "
                             "(docs/ui-and-safety.md#the-http-gate)."), []
        return None

    def _capped(self, scope: Scope, receive: Receive) -> Receive:
        """A body without Content-Length (chunked) is cut off at the limit: the app sees a disconnect."""
        path = scope.get("path", "")
        limit = self.policy.max_upload_bytes if path.startswith(UPLOAD_PATHS) else self.policy.max_body_bytes
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


def _with_security_headers(send: Send) -> Send:
    async def wrapped(message: Message) -> None:
        if message.get("type") == "http.response.start":
            names = {k.lower() for k, _ in message.get("headers", [])}
            message["headers"] = [*message.get("headers", []),
                                  *((k, v) for k, v in SECURITY_HEADERS if k not in names)]
        await send(message)

    return wrapped


async def _respond(send: Send, status: int, body: Any, extra: list[tuple[bytes, bytes]]) -> None:
    if isinstance(body, str):
        data, ctype = (body + "\n").encode(), b"text/plain; charset=utf-8"
    else:
        data, ctype = json.dumps(body).encode(), b"application/json"
    headers = [(b"content-type", ctype), (b"content-length", str(len(data)).encode()),
               (b"cache-control", b"no-store"), *SECURITY_HEADERS, *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
