"""`moet-panel gateway [--host H] [--port P] [--tls-cert F --tls-key F] [--insecure-http]`: the API gateway in
the foreground, in front of every GPU's engine of the data dir (docs/gateway.md). Ctrl-C stops it. It keeps the
panel's gateway's promises (docs/gateway.md "One gateway"): the same engine-status source (every GPU's engine as
the box shows it, drains of any process included), and its answers in flight published for any process's drain.

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

from app.backend.contracts import count_text
from app.backend import oplog

from app.backend.config import env
from app.backend.config.settings import Settings
from app.backend.engine.lifecycle.answers import AnswersPublisher
from app.backend.engine.runtime.client import base_url
from app.backend.fleet import fleetfile
from app.backend.fleet.front import FrontSource, make_front
from app.backend.fleet.source import FleetSource
from app.backend.gateway.caps import GatewayCaps
from app.backend.gateway.keys import KeyStore
from app.backend.gateway.leftout import LeftOutNotes
from app.backend.gateway.proxy import GatewayApp, Limits
from app.backend.gateway.engine_status import EngineStatusSource, PipeSource, ProbeSource
from app.backend.gateway.routing import box_source
from app.backend.gateway.server import (DEFAULT_PORT, GatewayConfig, GatewayConfigError, GatewayServer,
                                        engine_slots_of, limits_for_recipe)
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
    p.add_argument("--max-tokens", type=int, metavar="N", help="the most max_tokens a request may ask, for keys "
                   f"without their own cap (default {Limits.max_tokens}, or the recipe's context when smaller; "
                   "`keys set NAME --max-tokens N` sets a key's); more is refused with 400")
    p.add_argument("--max-hold-s", type=float, default=Limits.max_hold_s, metavar="S",
                   help="a key's time on the engine's sequences while another key waits; beyond, its answer is "
                   "ended there with a 429")
    p.add_argument("--engine-slots", type=int, metavar="N", help="requests sent to the engine at once; more wait in "
                   "the fair queue, taken in turn by key (default: the recipe's --max-num-seqs)")
    p.add_argument("--stall-s", type=float, default=Limits.stall_s, metavar="S",
                   help="cut an answer whose client acknowledges nothing of it for S seconds (499)")
    p.add_argument("--per-source", type=int, default=Limits.max_conn_per_source, metavar="N",
                   help="connections from one address (IPv6: one /64)")
    p.add_argument("--capture-bodies", type=int, default=0, metavar="BYTES",
                   help="keep the first BYTES of each request and answer in the activity log (default 0: metadata only)")
    p.add_argument("--engine-url", metavar="URL", help="an engine this data dir does not run (one you started "
                   "yourself): unix:/PATH of its socket, or http://HOST:PORT, probed once a second (no drains, one "
                   "engine). Default: every GPU's engine of the data dir, as the panel's gateway sees them")
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
                     max_hold_s=max(1.0, getattr(args, "max_hold_s", base.max_hold_s)),
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
    return _run_piped(args) if args.status_from_stdin else _run_standalone(args)


def _run_piped(args: argparse.Namespace) -> int:
    """The panel's child: the state dir given (no recipe or host probe to resolve; the panel passes the recipe's caps
    on argv), the status pushed by the panel (computed there by routing.box_source), its answers reported back on
    stdout (the panel counts and publishes them); its log lines join the panel's file (oplog)."""
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

    def new_caps(caps: GatewayCaps) -> None:  # the owner changed them on the Access tab (gateway/caps.py)
        if server_box:
            server_box[0].app.apply_caps(caps)

    engine: EngineStatusSource = PipeSource(sys.stdin.buffer, panel_gone, args.engine_url or "http://127.0.0.1:8000",
                                            on_caps=new_caps)
    fleet = _fleet_of(state_dir)
    if fleet is not None:
        # a fleet's front (docs/fleet.md): the same gateway, its upstream the router; the panel's status lines
        # still come (EOF: the panel is gone) but the fleet's boxes say whether it serves
        engine = FrontSource(fleet, engine)
    try:
        server = GatewayServer(config_from(args), keys, engine, report=reporter)
        if fleet is not None:
            make_front(server, fleet, _fleet_key(state_dir))
    except (GatewayConfigError, ValueError) as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        keys.close()
        return 2
    server_box.append(server)
    threading.Thread(target=_say_listening, args=(server,), name="gateway-started", daemon=True).start()
    try:
        server.run()
    finally:
        keys.close()
    return 0


def _run_standalone(args: argparse.Namespace) -> int:
    """In a terminal (or a service unit): the same promises as the panel's gateway (docs/gateway.md "One gateway").
    The engine status comes from controllers of its own that only observe the box (every GPU's engine, as Docker or
    the process runtime shows it, with readiness and any process's drain), through the panel's own source
    (routing.box_source); its answers in flight are published for any process's drain (engine/answers.py)."""
    settings = cli_settings(args)
    state_dir = settings.ensure_state_dir()
    oplog.configure(state_dir)
    keys = KeyStore(state_dir)
    base = limits_for_recipe(settings.recipe)
    box: ObservedBox | None = None
    engine: EngineStatusSource
    fleet = _fleet_of(state_dir)
    if fleet is not None:  # a fleet's front (docs/fleet.md): its upstream the router, the boxes say if it serves
        engine, where = fleet, f"the fleet's router ({fleet.status().base_url})"
    elif args.engine_url:  # an engine the panel does not manage: nothing to observe but its answers
        probe = ProbeSource(args.engine_url, settings.recipe.model.served_name)
        engine, where = probe, f"{probe.base_url} (probed; an engine this data dir does not run: no drains)"
    else:
        box = ObservedBox(settings)
        engine, where = box.source, box.describe()
    answers = _Answers()
    # its answers on this data dir's engines, for their drains (an engine given by --engine-url is not one of them)
    # on a box of several, also the GPUs it sends to: a rolling switch waits until it sees another one (answers.py)
    publisher = (AnswersPublisher(state_dir, [answers], answers.by_gpu if box.multi else None,
                                  (lambda: [e.gpu for e in box.source.status().engines if e.accepts]) if box.multi else None)
                 if box is not None else None)
    try:
        # every change of its count is published at once (the report hook), so a drain that starts now waits for it
        server = GatewayServer(config_from(args, base), keys, engine,
                               report=(lambda _msg: publisher.poke()) if publisher is not None else None)
        if fleet is not None:
            make_front(server, fleet, _fleet_key(state_dir))
    except (GatewayConfigError, ValueError) as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        keys.close()
        if box is not None:
            box.close()
        return 2
    server.app.who = oplog.CLI
    answers.app, answers.gpus = server.app, box.gpus if box is not None else []
    if publisher is not None:
        publisher.start()
    print(f"moet-panel gateway: {server.url}/v1 -> {where} "
          f"({'TLS' if server.cfg.tls else 'plain HTTP'}; {count_text(keys.active_count(), 'active key')}; Ctrl-C stops)",
          flush=True)
    try:
        server.run()
    finally:
        if publisher is not None:
            publisher.close()
        if box is not None:
            box.close()
        keys.close()
    return 0


def _fleet_of(state_dir: Path) -> FleetSource | None:
    """The fleet's boxes when this data dir holds a fleet file (this gateway is then the fleet's front), else None."""
    return FleetSource(lambda: fleetfile.load(state_dir)) if fleetfile.load(state_dir) is not None else None


def _fleet_key(state_dir: Path) -> str:
    return (fleetfile.load(state_dir) or fleetfile.FleetConfig("")).fleet_key


class _Answers:
    """The standalone gateway's answers in flight, for other processes' drains (contracts.AnswerCounter)."""

    def __init__(self) -> None:
        self.app: GatewayApp | None = None
        self.gpus: list[int] = []

    def answers_in_flight(self) -> int:
        return self.app.answers_in_flight() if self.app is not None else 0

    def by_gpu(self) -> dict[int, int]:
        app = self.app
        return {g: app.answers_in_flight_on(g) for g in self.gpus} if app is not None else {}


class ObservedBox:
    """Every GPU's engine of this data dir, observed by controllers that never act: no supervision, no stall
    restart, no operation (the panel or the CLI does those); they read Docker (or the process runtime), probe
    readiness and follow any process's drain note, exactly as the panel's controllers do (docs/engine.md "One
    truth"). The GPUs the panel's self-test or A/B measures on are left out (gateway/leftout.py)."""

    def __init__(self, settings: Settings) -> None:
        from app.backend.state import make_box_gpus
        from app.backend.engine.lifecycle.tickets import ControllerOptions
        from app.backend.profiles.registry import ProfileRegistry
        from app.backend.telemetry.gpu import box_gpu_count, make_gpu_reader

        reader = make_gpu_reader(settings)
        self._box_gpus = make_box_gpus(settings, reader, box_gpu_count(reader),
                                 lambda gpu: ControllerOptions(actor="CLI", restart_on_stall=False))
        profiles = ProfileRegistry(settings)
        self.gpus = self._box_gpus.gpus
        self.multi = len(self.gpus) > 1
        box_gpus = self._box_gpus
        # a self-test or A/B measuring on a GPU, in the panel (or any process): that GPU gets nothing from here
        left = LeftOutNotes(settings.ensure_state_dir())
        self.source = box_source(self.gpus, lambda g: box_gpus.controller(g).snapshot,
                                 lambda g: base_url(settings.recipe, settings.data_dir, g),
                                 lambda pid: engine_slots_of(settings.recipe, profiles.find(pid)), left.others)

    def describe(self) -> str:
        return (f"the engines of GPUs {', '.join(map(str, self.gpus))} of this data dir" if self.multi
                else "the engine of this data dir")

    def close(self) -> None:
        self._box_gpus.close()  # its threads only; the engines keep running


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
