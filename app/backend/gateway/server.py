"""Run the gateway with uvicorn: in the foreground (`moet-panel gateway`, and the panel's gateway process, which is
the same command fed by the panel: docs/gateway.md "How the panel runs it") or on a thread (tests, benches).

The bind rule mirrors the panel's own (docs/gateway.md#binding): loopback needs nothing; any other
address needs TLS (a certificate and key you point it at) or an explicit `--insecure-http`, and at
least one active key.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn

from app.backend.gateway.keys import KeyStore
from app.backend.gateway.proxy import GatewayApp, Limits
from app.backend.gateway.readiness import EngineStatusSource

DEFAULT_PORT = 8001


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


def config_from_env(limits: Limits | None = None) -> GatewayConfig:
    """The panel's gateway settings (docs/configuration.md): MOET_PANEL_GATEWAY_HOST/_PORT/_TLS_CERT/_TLS_KEY."""
    from app.backend import env

    cert, key = env.gateway_tls()
    return GatewayConfig(host=env.gateway_host() or "127.0.0.1", port=env.gateway_port() or DEFAULT_PORT,
                         tls_cert=Path(cert).expanduser() if cert else None,
                         tls_key=Path(key).expanduser() if key else None, limits=limits or Limits())


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
    each request is on the gateway's added latency (docs/gateway.md#benchmark)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:  # httptools missing: the same behaviour, slower
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


def header_deadline_protocol(timeout_s: float, max_head_bytes: int = MAX_HEAD_BYTES) -> type:
    """uvicorn's HTTP protocol with a deadline and a size cap for a request's headers: uvicorn bounds the
    idle time between requests (keep-alive) but not a client that sends its headers a byte at a time
    (slowloris), nor, with httptools, headers without end. The body has its own deadline in the app
    (Limits.body_timeout_s)."""
    base: Any = http_protocol_base()

    class HeaderDeadline(base):  # type: ignore[misc]
        _deadline: asyncio.TimerHandle | None = None
        _head_bytes: int = 0

        def _waiting_for_headers(self) -> bool:
            cycle = getattr(self, "cycle", None)
            return cycle is None or bool(getattr(cycle, "response_complete", False))

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._deadline = self.loop.call_later(timeout_s, self._too_slow)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                return
            if not self._waiting_for_headers():
                self._head_bytes = 0
                if self._deadline is not None:
                    self._deadline.cancel()
                    self._deadline = None
                return
            self._head_bytes += len(data)
            if self._head_bytes > max_head_bytes:
                self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n"
                                     b"connection: close\r\n\r\n")
                self.transport.close()
            elif self._deadline is None:  # the first bytes of the next request on a kept-alive connection
                self._deadline = self.loop.call_later(timeout_s, self._too_slow)

        def _too_slow(self) -> None:
            self._deadline = None
            if self._waiting_for_headers() and not self.transport.is_closing():
                self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
            super().connection_lost(exc)

    return HeaderDeadline


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """uvloop's loop when installed (libuv: fewer Python frames per socket event), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


class GatewayServer:
    """One uvicorn server for one GatewayApp; `run()` blocks, `start()` runs it on a thread."""

    def __init__(self, cfg: GatewayConfig, keys: KeyStore, engine: EngineStatusSource):
        check_config(cfg, keys.active_count())
        self.cfg = cfg
        self.app = GatewayApp(keys, engine, cfg.limits)
        self.sock = bind_socket(cfg.host, cfg.port)
        self.port = int(self.sock.getsockname()[1])
        self._server = uvicorn.Server(uvicorn.Config(
            self.app, log_level="warning", access_log=False,  # the activity log is ours: metadata, no keys
            lifespan="on", ssl_certfile=str(cfg.tls_cert) if cfg.tls_cert else None,
            ssl_keyfile=str(cfg.tls_key) if cfg.tls_key else None,
            timeout_keep_alive=75, h11_max_incomplete_event_size=MAX_HEAD_BYTES,
            http=header_deadline_protocol(cfg.limits.header_timeout_s),
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
                runner.run(self._server.serve(sockets=[self.sock]))
        finally:
            self.sock.close()

    def start(self) -> None:
        def target() -> None:
            try:
                self.run()
            except Exception as exc:  # shown as the gateway's state in the panel
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
