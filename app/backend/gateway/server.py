"""Run the gateway with uvicorn: in the foreground (`moet-panel gateway`, and the panel's gateway process, which is
the same command fed by the panel: docs/gateway.md "How the panel runs it") or on a thread (tests, benches).

The bind rule mirrors the panel's own (docs/gateway.md#binding): loopback needs nothing; any other
address needs TLS (a certificate and key you point it at) or an explicit `--insecure-http`, and at
least one active key.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from app.backend import oplog
from app.backend.gateway.connguard import ConnGuard
from app.backend.gateway.keys import DEFAULT_SCOPE, FLEET_SCOPE, KeyStore
from app.backend.gateway.proxy import GatewayApp, Limits
from app.backend.gateway.engine_status import EngineStatusSource

if TYPE_CHECKING:
    from app.backend.recipe.schema import ProfileSpec, Recipe

DEFAULT_PORT = 8001
QUEUE_REPORT_S = 0.2  # how often the fair queue's order is looked at for the panel (sent only when it changed)
QUEUE_REPORT_KEYS = 64  # the first waiting keys reported (the panel needs its own key's place only)


class GatewayConfigError(ValueError):
    """The gateway cannot start this way; the message says why and what to do."""


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    tls_cert: Path | None = None
    tls_key: Path | None = None
    insecure_http: bool = False
    limits: Limits = field(default_factory=Limits)

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def url(self, port: int | None = None) -> str:
        host = self.host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        return f"{'https' if self.tls else 'http'}://{host}:{port or self.port}"


def limits_for_recipe(recipe: Recipe, base: Limits | None = None) -> Limits:
    """The limits a recipe implies (docs/gateway.md "Caps"): `max_tokens` the gateway's default cap (a shared
    box's, issue 48) or the context it was validated at when smaller, and as many engine slots as its recommended
    profile runs sequences (`--max-num-seqs`; vLLM's 256 when absent), so the fair queue, not the engine's arrival
    order, decides who goes next."""
    base = base or Limits()
    seqs = engine_slots_of(recipe, recipe.recommended_profile) or base.engine_slots
    ctx = max(1, int(recipe.context.validated_max_tokens))
    return replace(base, max_tokens=min(base.max_tokens, ctx), context_tokens=ctx, engine_slots=seqs)


def engine_slots_of(recipe: Recipe, profile: ProfileSpec | None) -> int:
    """The sequences `profile` runs at once (`--max-num-seqs`; vLLM's 256 when absent); 0 when unknown. The
    panel tells its gateway this for the running profile (readiness.EngineStatus.slots)."""
    if profile is None:
        return 0
    try:
        seqs_arg = recipe.command(profile).arg_value("--max-num-seqs")
        return max(1, int(seqs_arg)) if seqs_arg else 256
    except (ValueError, KeyError, AttributeError) as exc:  # a hand-edited profile: the gateway's own setting
        oplog.caught("gateway", exc, "reading a profile's --max-num-seqs", recipe=recipe.id, profile=profile.id)
        return 0


def config_from_env(limits: Limits | None = None, recipe: Recipe | None = None) -> GatewayConfig:
    """The panel's gateway settings (docs/configuration.md): MOET_PANEL_GATEWAY_HOST/_PORT/_TLS_CERT/_TLS_KEY;
    with a recipe, its caps (`limits_for_recipe`)."""
    from app.backend.config import env

    cert, key = env.gateway_tls()
    lim = limits or Limits()
    if recipe is not None:
        lim = limits_for_recipe(recipe, lim)
    return GatewayConfig(host=env.gateway_host() or "127.0.0.1", port=env.gateway_port() or DEFAULT_PORT,
                         tls_cert=Path(cert).expanduser() if cert else None,
                         tls_key=Path(key).expanduser() if key else None, limits=lim)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: treated as reachable from elsewhere


def check_config(cfg: GatewayConfig, active_keys: int) -> None:
    """Refuse an unsafe or broken configuration before binding (raises GatewayConfigError)."""
    if (cfg.tls_cert is None) != (cfg.tls_key is None):
        raise GatewayConfigError("TLS needs both --tls-cert FILE and --tls-key FILE")
    if cfg.tls_cert is not None and cfg.tls_key is not None:
        for p in (cfg.tls_cert, cfg.tls_key):
            if not Path(p).is_file():
                raise GatewayConfigError(f"TLS file {p} does not exist or is not a file")
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(str(cfg.tls_cert), str(cfg.tls_key))
        except (ssl.SSLError, OSError) as exc:
            raise GatewayConfigError(f"cannot load the TLS certificate/key ({exc}); check they are PEM and match") from None
    if not (0 <= cfg.port <= 65535):
        raise GatewayConfigError(f"port {cfg.port} is not a TCP port")
    if is_loopback(cfg.host):
        return
    if not cfg.tls and not cfg.insecure_http:
        raise GatewayConfigError(
            f"refusing to serve on {cfg.host} without TLS: keys would cross the network in clear text. Give "
            "--tls-cert FILE --tls-key FILE, or --insecure-http if another layer encrypts (VPN, SSH tunnel)")
    if active_keys < 1:
        raise GatewayConfigError(
            f"refusing to serve on {cfg.host} with no API key: create one with `moet-panel keys create NAME`")


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only when it sees a TCP proto,
    # and without it each streamed chunk after the headers waited for the client's delayed ACK (+40 ms TTFT,
    # bench/gateway); the option is set on the listener too (Linux copies it to accepted sockets)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise GatewayConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}; pick another --port") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


MAX_HEAD_BYTES = 64 * 1024  # a request's line and headers together (the h11 parser's cap, enforced for httptools)


def http_protocol_base() -> type:
    """uvicorn's httptools protocol (llhttp, in C) when installed, else its pure-Python h11 one: the parse of
    each request is on the gateway's added latency (docs/gateway.md#benchmark-benchgatewayrunpy)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:  # httptools missing: the same behaviour, slower
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def _refusal_bytes(status: int, reason: str, message: str, kind: str) -> bytes:
    """A whole HTTP answer written by the protocol itself (no app call): OpenAI's error shape, then close."""
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


def header_deadline_protocol(timeout_s: float, max_head_bytes: int = MAX_HEAD_BYTES, first_timeout_s: float | None = None,
                             guard: ConnGuard | None = None) -> type:
    """uvicorn's HTTP protocol with a deadline and a size cap for a request's headers, and a cap on connections
    per source: uvicorn bounds the idle time between requests (keep-alive) but not a client that sends its
    headers a byte at a time (slowloris), nor, with httptools, headers without end, nor one address holding
    every connection (connguard.py). A connection that has not yet shown a valid key must send its first
    request's headers within `first_timeout_s` (a stranger's idle connection lives seconds, not the keep-alive's
    75 s); the app closes it after a refusal. The body has its own deadline in the app (Limits.body_timeout_s)."""
    base: Any = http_protocol_base()
    first_s = timeout_s if first_timeout_s is None else first_timeout_s

    class HeaderDeadline(base):  # type: ignore[misc]
        _deadline: asyncio.TimerHandle | None = None
        _head_bytes: int = 0
        _tail: bytes = b""
        _registered: bool = False
        authed: bool = False

        def _waiting_for_headers(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is None or bool(getattr(cycle, "response_complete", False))

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            if guard is not None:
                if not guard.opened(self, self.client):
                    transport.write(_refusal_bytes(429, "Too Many Requests", "too many connections from your "
                                                   "address; close idle ones and retry", "rate_limit_error"))
                    transport.close()
                    return
                self._registered = True
            self._deadline = self.loop.call_later(first_s, self._too_slow)

        def evictable(self) -> bool:
            return not self.authed and self._waiting_for_headers() and not self.transport.is_closing()

        def evict(self) -> None:
            self._registered = False
            self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self._waiting_for_headers():
                # count the head's bytes before the parser sees them: with httptools a whole oversized head
                # in one read was parsed and served before any count (issue 40)
                seen = self._tail + data
                end = seen.find(b"\r\n\r\n")
                self._head_bytes += len(data) if end < 0 else max(0, end + 4 - len(self._tail))
                if self._head_bytes > max_head_bytes:
                    if guard is not None:
                        guard.refusal("header_too_large")
                    self.transport.write(_refusal_bytes(
                        431, "Request Header Fields Too Large", f"the request line and headers are over "
                        f"{max_head_bytes} bytes", "invalid_request_error"))
                    self.transport.close()
                    return
                self._tail = seen[-3:] if end < 0 else b""
                if self._deadline is None:  # the first bytes of the next request on a kept-alive connection
                    self._deadline = self.loop.call_later(timeout_s if self.authed else first_s, self._too_slow)
            super().data_received(data)
            if self.transport.is_closing():
                return
            if not self._waiting_for_headers():
                self._head_bytes = 0
                self._tail = b""
                if self._deadline is not None:
                    self._deadline.cancel()
                    self._deadline = None

        def _too_slow(self) -> None:
            self._deadline = None
            if self._waiting_for_headers() and not self.transport.is_closing():
                if guard is not None:
                    guard.refusal("header_timeout")
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            if guard is not None:
                guard.closed(self, self.client)
            super().connection_lost(exc)

    return HeaderDeadline


def raise_fd_limit() -> int:
    """Raise this process's open-file limit to its hard limit (the soft one is often 1,024: fewer than the
    connections the gateway is meant to hold, docs/gateway.md "Caps"). Returns the soft limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            oplog.caught("gateway", exc, "raising the open-file limit", soft=soft, hard=hard)
    return soft


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop when installed (libuv: fewer Python frames per socket event), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


class GatewayServer:
    """One uvicorn server for one GatewayApp; `run()` blocks, `start()` runs it on a thread."""

    def __init__(self, cfg: GatewayConfig, keys: KeyStore, engine: EngineStatusSource,
                 report: Callable[[dict[str, object]], None] | None = None):
        # the panel's chat key opens nothing to others; a fleet key opens this box to its front
        check_config(cfg, keys.active_count((DEFAULT_SCOPE, FLEET_SCOPE), owners_only=True))
        self.cfg = cfg
        self.fd_limit = raise_fd_limit()
        self.app = GatewayApp(keys, engine, cfg.limits, report=report)
        self._report = report
        # the global rule a little below uvicorn's cap, whose count includes running tasks
        self.guard = ConnGuard(cfg.limits.max_conn_per_source, on_refusal=self.app.note_refusal,
                               total=max(1, cfg.limits.max_connections - 32))
        self.app.guard = self.guard
        self.sock = bind_socket(cfg.host, cfg.port)
        self.port = int(self.sock.getsockname()[1])
        self._server = uvicorn.Server(uvicorn.Config(
            self.app, log_level="warning", access_log=False,  # the activity log is ours: metadata, no keys
            lifespan="on", ssl_certfile=str(cfg.tls_cert) if cfg.tls_cert else None,
            ssl_keyfile=str(cfg.tls_key) if cfg.tls_key else None,
            timeout_keep_alive=75, h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            http=header_deadline_protocol(cfg.limits.header_timeout_s, first_timeout_s=cfg.limits.first_header_timeout_s,
                                          guard=self.guard),
            limit_concurrency=cfg.limits.max_connections,  # beyond it uvicorn answers 503 at once
            server_header=False, date_header=False))
        self._thread: threading.Thread | None = None
        self.error: str = ""

    @property
    def url(self) -> str:
        return self.cfg.url(self.port)

    @property
    def started(self) -> bool:
        return bool(self._server.started)

    def run(self) -> None:
        """Serve until stopped (SIGINT/SIGTERM in the foreground)."""
        try:
            with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
                runner.run(self._serve())
        finally:
            self.sock.close()

    async def _serve(self) -> None:
        watcher = asyncio.create_task(self._report_queue()) if self._report is not None else None
        try:
            await self._server.serve(sockets=[self.sock])
        finally:
            if watcher is not None:
                watcher.cancel()

    async def _report_queue(self) -> None:
        """The fair queue's order, by key hash, whenever it changes: the panel's Chat tab shows its own key's place
        ("waiting for the GPU (n ahead)", docs/chat.md "Taking turns"). Read on the event loop (the queue's thread)."""
        assert self._report is not None
        last: dict[str, int] = {}
        while True:
            await asyncio.sleep(QUEUE_REPORT_S)
            try:
                ahead = self.app.queue.ahead()
                now = dict(sorted(ahead.items(), key=lambda kv: kv[1])[:QUEUE_REPORT_KEYS])
                if now != last:
                    self._report({"queue_ahead": now})
                    last = now
            except Exception as exc:  # a bug here must not stop serving; the chat then shows no place
                oplog.caught("gateway", exc, "reporting the fair queue's order", traceback=True)

    def start(self) -> None:
        def target() -> None:
            try:
                self.run()
            except Exception as exc:  # shown as the gateway's state in the panel
                oplog.caught("gateway", exc, "serving on a thread", traceback=True)
                self.error = f"{type(exc).__name__}: {exc}"

        # uvicorn installs signal handlers only on the main thread; here the panel keeps its own
        self._thread = threading.Thread(target=target, name="moet-gateway", daemon=True)
        self._thread.start()

    def wait_started(self, timeout: float) -> bool:
        if self._thread is None:
            return False
        self._thread.join(0)
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._server.started:
                return True
            if not self._thread.is_alive():
                return False
            time.sleep(0.02)
        return bool(self._server.started)

    def request_exit(self, grace_s: float = 5.0) -> None:
        """Stop from any thread, without waiting: the listener closes at uvicorn's next tick (0.1 s); answers
        still streaming get `grace_s`, then are cut."""
        self._server.should_exit = True
        timer = threading.Timer(grace_s, lambda: setattr(self._server, "force_exit", True))
        timer.daemon = True
        timer.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout)
