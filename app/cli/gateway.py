"""`moet-panel gateway [--host H] [--port P] [--tls-cert F --tls-key F] [--insecure-http]`: the API gateway in
the foreground, in front of the engine on loopback (docs/gateway.md). Ctrl-C stops it.

The panel runs this same command as its gateway process, with `--status-from-stdin --state-dir DIR`: the engine's
status comes as JSON lines on stdin instead of probes, one JSON line on stdout says it listens, and EOF on
stdin (the panel gone) stops it (docs/gateway.md, "How the panel runs it")."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from app.backend import oplog

from app.backend.config import env
from app.backend.engine.runtime.client import base_url
from app.backend.gateway.keys import KeyStore
from app.backend.gateway.proxy import Limits
from app.backend.gateway.engine_status import EngineStatusSource, PipeSource, ProbeSource
from app.backend.gateway.server import (DEFAULT_PORT, GatewayConfig, GatewayConfigError, GatewayServer,
                                        limits_for_recipe)
from app.cli.keys import cli_settings
from app.cli.main import add_common


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("gateway", help="serve the model to other machines: API keys, limits, usage (foreground)")
    add_common(p)
    p.add_argument("--host", help="address to listen on (default 127.0.0.1; env MOET_PANEL_GATEWAY_HOST); beyond "
                   "loopback needs TLS or --insecure-http, and a key")
    p.add_argument("--port", type=int, help=f"port (default {DEFAULT_PORT}; env MOET_PANEL_GATEWAY_PORT; 0 = any free)")
    p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate (env MOET_PANEL_GATEWAY_TLS_CERT)")
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key (env MOET_PANEL_GATEWAY_TLS_KEY)")
    p.add_argument("--insecure-http", action="store_true", help="allow plain HTTP beyond loopback (keys in clear text)")
    p.add_argument("--max-concurrent", type=int, default=Limits.max_concurrent, metavar="N", help="requests in flight per key")
    p.add_argument("--rate", type=float, default=Limits.rate_per_min, metavar="N", help="requests per minute per key")
    p.add_argument("--max-body-mb", type=float, default=Limits.max_body_bytes / 2**20, metavar="MB", help="request body cap")
    p.add_argument("--max-tokens", type=int, metavar="N", help="the most max_tokens a request may ask, every key "
                   "(default: the recipe's validated context); more is refused with 400")
    p.add_argument("--engine-slots", type=int, metavar="N", help="requests sent to the engine at once; more wait in "
                   "the fair queue, taken in turn by key (default: the recipe's --max-num-seqs)")
    p.add_argument("--stall-s", type=float, default=Limits.stall_s, metavar="S",
                   help="cut a stream whose client reads nothing for S seconds (frees the engine)")
    p.add_argument("--per-source", type=int, default=Limits.max_conn_per_source, metavar="N",
                   help="connections from one address (IPv6: one /64)")
    p.add_argument("--capture-bodies", type=int, default=0, metavar="BYTES",
                   help="keep the first BYTES of each request and answer in the activity log (default 0: metadata only)")
    p.add_argument("--engine-url", metavar="URL", help="the engine's address: unix:/PATH of its socket, or "
                   "http://HOST:PORT (default: the panel's engine, on its socket in the data dir)")
    # the panel's own way to run it (app/backend/gateway/switch.py), not for a terminal
    p.add_argument("--status-from-stdin", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--state-dir", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def config_from(args: argparse.Namespace, base: Limits | None = None) -> GatewayConfig:
    """`base`: the recipe's limits (server.limits_for_recipe) when known; flags override them."""
    cert, key = env.gateway_tls()
    base = base or Limits()
    limits = replace(base, max_concurrent=max(1, args.max_concurrent), rate_per_min=max(0.1, args.rate),
                     max_body_bytes=int(args.max_body_mb * 2**20), capture_bodies=args.capture_bodies > 0,
                     capture_cap_bytes=max(0, args.capture_bodies), stall_s=max(0.5, args.stall_s),
                     max_conn_per_source=max(1, args.per_source),
                     max_tokens=max(1, args.max_tokens) if args.max_tokens else base.max_tokens,
                     engine_slots=max(1, args.engine_slots) if args.engine_slots else base.engine_slots)
    cert_path = args.tls_cert or cert
    key_path = args.tls_key or key
    return GatewayConfig(
        host=args.host or env.gateway_host() or "127.0.0.1",
        port=args.port if args.port is not None else (env.gateway_port() or DEFAULT_PORT),
        tls_cert=Path(cert_path).expanduser() if cert_path else None,
        tls_key=Path(key_path).expanduser() if key_path else None,
        insecure_http=args.insecure_http, limits=limits)


def run(args: argparse.Namespace) -> int:
    piped = bool(args.status_from_stdin)
    engine: EngineStatusSource
    base: Limits | None = None
    reporter: Reporter | None = None
    if piped:
        # the panel's child: the state dir given (no recipe or host probe to resolve; the panel passes the
        # recipe's caps on argv), the status pushed; its log lines join the panel's file (oplog)
        state_dir = Path(args.state_dir) if args.state_dir else cli_settings(args).ensure_state_dir()
        oplog.configure(state_dir)
        keys = KeyStore(state_dir)
        reporter = Reporter(sys.stdout)
        server_box: list[GatewayServer] = []

        def panel_gone() -> None:
            if server_box:
                server_box[0].request_exit()
            # a last resort: never outlive the panel by more than a few seconds, whatever hangs
            last = threading.Timer(10.0, lambda: os._exit(3))
            last.daemon = True  # a clean shutdown before it exits 0 at once
            last.start()

        engine = PipeSource(sys.stdin.buffer, panel_gone, args.engine_url or "http://127.0.0.1:8000")
        where = "the panel's engine"
    else:
        settings = cli_settings(args)
        oplog.configure(settings.ensure_state_dir())
        keys = KeyStore(settings.ensure_state_dir())
        base = limits_for_recipe(settings.recipe)
        probe = ProbeSource(args.engine_url or base_url(settings.recipe, settings.data_dir),
                            settings.recipe.model.served_name)
        engine, where = probe, probe.base_url
    try:
        server = GatewayServer(config_from(args, base), keys, engine, report=reporter)
    except (GatewayConfigError, ValueError) as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        keys.close()
        return 2
    if not piped:
        server.app.who = oplog.CLI
    if piped:
        server_box.append(server)
        threading.Thread(target=_say_listening, args=(server,), name="gateway-started", daemon=True).start()
    else:
        print(f"moet-panel gateway: {server.url}/v1 -> engine {where} "
              f"({'TLS' if server.cfg.tls else 'plain HTTP'}; {keys.active_count()} active key(s); Ctrl-C stops)",
              flush=True)
    try:
        server.run()
    finally:
        keys.close()
    return 0


def _say_listening(server: GatewayServer) -> None:
    """The panel's child: one JSON line on stdout once uvicorn serves (the panel waits for it)."""
    while not server.started:
        time.sleep(0.01)
    print(json.dumps({"listening": server.url, "port": server.port, "pid": os.getpid()}), flush=True)


class Reporter:
    """The panel's child tells the panel its answers in flight and its figures, one JSON line each on stdout
    (service.py reads them), from a thread of its own: the event loop hands over the latest of each kind and
    never waits on the pipe (a panel slow to read would otherwise stall every answer)."""

    def __init__(self, stream: object) -> None:
        self._stream = stream
        self._latest: dict[str, object] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        threading.Thread(target=self._run, name="gateway-report", daemon=True).start()

    def __call__(self, msg: dict[str, object]) -> None:
        with self._lock:
            self._latest.update(msg)
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                latest, self._latest = self._latest, {}
            try:
                for kind, value in latest.items():
                    print(json.dumps({kind: value}, separators=(",", ":")), file=self._stream, flush=True)  # type: ignore[call-overload]
            except (OSError, ValueError) as exc:  # the panel is gone: the status pipe's EOF stops us
                oplog.caught("gateway", exc, "reporting to the panel")
                return
