"""`/metrics` on the panel's port and who may read it (docs/metrics.md#access).

* Auth off (the default: the panel listens on loopback only): open, as node_exporter and vLLM are.
* Login on: a bearer token from a file (`--metrics-token-file`, env MOET_PANEL_METRICS_TOKEN_FILE),
  compared in constant time. The token opens `/metrics` and nothing else (the gate's session check
  ignores it), and the panel's session cookie does not open `/metrics`: a scraper never holds a login,
  and a signed-in browser tab cannot be made to leak the figures to another page either.

The route is served by the web gate itself (app/backend/web/gate.py `GatePolicy.routes`), after its
Host, forwarding-header and Origin checks, in front of Gradio.
"""

from __future__ import annotations

import hmac
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from app.backend.config import env
from app.backend.contracts import Receive, Scope, Send
from app.backend.prometheus.collector import PanelCollector

if TYPE_CHECKING:
    from app.backend.state import AppState


PATH = "/metrics"
METRICS_SCOPE = "metrics"  # the key store's scope for it (app/backend/gateway/keys.py SCOPES)
MIN_TOKEN_CHARS = 32  # `openssl rand -hex 32` gives 64


class MetricsTokenError(ValueError):
    """The token file is missing, unsafe or too weak; the message says how to fix it."""


def token_help(path: Path) -> str:
    return (f"create it with: umask 077; openssl rand -hex 32 > {path}  (Prometheus reads the same file: "
            "`authorization: {credentials_file: ...}` in assets/monitoring/prometheus.yml)")


def load_token(path: Path) -> str:
    """The token in `path` (surrounding blanks removed). Refused: unreadable, writable by group or others,
    readable by others, shorter than MIN_TOKEN_CHARS, or blanks inside."""
    try:
        st = path.stat()
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise MetricsTokenError(f"metrics token file {path}: cannot read ({why}); {token_help(path)}") from None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH | stat.S_IROTH):
        raise MetricsTokenError(f"metrics token file {path} is readable or writable by other users; run "
                                f"`chmod 600 {path}` (or 640 with the Prometheus user's group)")
    token = text.strip()
    if len(token) < MIN_TOKEN_CHARS or any(c.isspace() for c in token) or not token.isascii():
        raise MetricsTokenError(f"metrics token file {path}: expected one token of at least {MIN_TOKEN_CHARS} "
                                f"printable ASCII characters; {token_help(path)}")
    return token


def token_file(flag: str | None) -> Path | None:
    """The token file from the flag, else the environment (app/backend/config/env.py), else None."""
    raw = flag or env.metrics_token_file()
    return Path(raw).expanduser() if raw else None


@dataclass(frozen=True)
class MetricsAccess:
    """`auth_on`: the panel has a login. `token`: the bearer token (None: no token file given)."""

    auth_on: bool = False
    token: str | None = None


class MetricsRoute:
    """The ASGI app the gate serves at PATH: access check, then the collector's text format."""

    def __init__(self, state: AppState, access: MetricsAccess) -> None:
        self.state = state
        self.access = access
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(PanelCollector(state))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _denied(self, headers: dict[bytes, bytes]) -> tuple[int, str] | None:
        a = self.access
        if not a.auth_on:
            return None
        counters = self.state.counters
        # The gateway's key store (issue 31) issues keys of scope `metrics`: each opens /metrics as the file does.
        keys = self.state.gateway.keys if self.state.gateway is not None else None
        if a.token is None and (keys is None or keys.active_count(METRICS_SCOPE) == 0):
            counters.metrics_denied("no_token_file")
            return 403, ("/metrics needs a bearer token while the panel has a login: start the panel with "
                         f"--metrics-token-file FILE (env {env.METRICS_TOKEN_FILE}), or create a key with "
                         "`moet-panel keys create NAME --scope metrics`; docs/metrics.md#access")
        scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        given = given.strip()
        if scheme.lower() != "bearer" or not given:
            counters.metrics_denied("no_token")
            return 401, "/metrics needs `Authorization: Bearer <token>` (--metrics-token-file, or a key of scope metrics)."
        if a.token is not None and hmac.compare_digest(given.encode(), a.token.encode()):
            return None
        if keys is not None and keys.authenticate(given, scope=METRICS_SCOPE) is not None:
            return None
        counters.metrics_denied("bad_token")
        return 401, "/metrics: wrong bearer token."

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if scope.get("method") not in ("GET", "HEAD"):
            await _respond(send, 405, b"/metrics answers GET only.\n", "text/plain; charset=utf-8", [(b"allow", b"GET, HEAD")])
            return
        denied = self._denied(headers)
        if denied is not None:
            status, text = denied
            extra = [(b"www-authenticate", b'Bearer realm="moet-panel metrics"')] if status == 401 else []
            await _respond(send, status, (text + "\n").encode(), "text/plain; charset=utf-8", extra)
            return
        body = self.render()
        await _respond(send, 200, b"" if scope.get("method") == "HEAD" else body, CONTENT_TYPE_PLAIN_0_0_4, [],
                       length=len(body))


async def _respond(send: Send, status: int, body: bytes, ctype: str, extra: list[tuple[bytes, bytes]],
                   length: int | None = None) -> None:
    headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body) if length is None else length).encode()),
               (b"cache-control", b"no-store"), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
