"""`moet-panel fleet init|key|add|remove|list|status|prometheus-config|serve`: several boxes behind one endpoint
(docs/fleet.md). The front holds the fleet file (`<data dir>/.moet-panel/fleet.json`), the clients' keys, usage
and fair queue; vLLM's router runs on its loopback with every box's gateway as a worker."""

from __future__ import annotations

import argparse
import json
import signal
from dataclasses import replace
import sys
import threading
import time
from pathlib import Path

from app.backend import oplog
from app.backend.fleet import fleetfile
from app.backend.fleet.boxes import status as box_status
from app.backend.fleet.fleetfile import FleetError
from app.backend.fleet.manage import add_box, remove_box
from app.backend.fleet.promconfig import render
from app.backend.fleet.router import RouterAdmin
from app.backend.gateway.proxy import Limits
from app.cli.keys import cli_settings
from app.cli.main import add_common


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("fleet", help="several boxes behind one endpoint (docs/fleet.md)")
    add_common(p)
    fs = p.add_subparsers(dest="fleet_cmd", metavar="ACTION", required=True)
    i = fs.add_parser("init", help="make this machine a fleet's front: the fleet file and the fleet key")
    i.add_argument("--router-port", type=int, default=fleetfile.ROUTER_PORT, help="the router's port (loopback)")
    i.add_argument("--router-metrics-port", type=int, default=fleetfile.ROUTER_METRICS_PORT,
                   help="the router's Prometheus port (loopback)")
    fs.add_parser("key", help="print the fleet key (give it to each box: `moet-panel keys create front --scope "
                  "fleet --key-stdin`)")
    a = fs.add_parser("add", help="add a box (checked first: it answers, takes the fleet key, serves the model)")
    a.add_argument("name")
    a.add_argument("url", help="the box's gateway, http(s)://HOST:PORT")
    a.add_argument("--metrics-url", default="", help="the box's panel /metrics (Prometheus, the Fleet tab)")
    a.add_argument("--metrics-token", default="", help="bearer token of that /metrics (when the panel has a login)")
    r = fs.add_parser("remove", help="remove a box (the router lets it go without a restart)")
    r.add_argument("name")
    fs.add_parser("list", help="the boxes in the fleet file")
    fs.add_parser("status", help="each box's status now, and the router's view of it")
    pc = fs.add_parser("prometheus-config", help="write a Prometheus configuration for the whole fleet")
    pc.add_argument("--out", metavar="FILE", help="write there (default: stdout)")
    pc.add_argument("--interval", type=int, default=15, metavar="S", help="scrape interval")
    pc.add_argument("--rules", metavar="FILE", action="append", help="rule files to load (default fleet-rules.yml)")
    sv = fs.add_parser("serve", help="run the front in the foreground: the router and the gateway in front of it")
    sv.add_argument("--host", default="127.0.0.1", help="the front gateway's address (clients reach it)")
    sv.add_argument("--port", type=int, default=8001)
    sv.add_argument("--insecure-http", action="store_true", help="plain HTTP beyond loopback (keys in clear text)")
    sv.add_argument("--max-concurrent", type=int, default=Limits.max_concurrent, metavar="N", help="requests in flight per key")
    sv.add_argument("--rate", type=float, default=Limits.rate_per_min, metavar="N", help="requests per minute per key")
    for action in fs.choices.values():
        add_common(action)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = cli_settings(args)
    state_dir = settings.ensure_state_dir()
    oplog.configure(state_dir)
    try:
        return _run(args, state_dir)
    except FleetError as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        return 2


def _loaded(state_dir: Path) -> fleetfile.FleetConfig:
    cfg = fleetfile.load(state_dir)
    if cfg is None:
        raise FleetError("no fleet here yet: `moet-panel fleet init` makes the fleet file and its key")
    return cfg


def _run(args: argparse.Namespace, state_dir: Path) -> int:
    cmd = args.fleet_cmd
    if cmd == "init":
        cfg = fleetfile.new_fleet(state_dir, args.router_port, args.router_metrics_port)
        oplog.decision("fleet", "init", who=oplog.CLI, router_port=cfg.router_port)
        print(cfg.fleet_key)
        print("# the fleet key: on each box run `moet-panel keys create front --scope fleet --key-stdin` and paste it;"
              " `moet-panel fleet key` prints it again", file=sys.stderr)
        return 0
    if cmd == "key":
        print(_loaded(state_dir).fleet_key)
        return 0
    if cmd == "add":
        st, router = add_box(state_dir, args.name, args.url, args.metrics_url, args.metrics_token, who=oplog.CLI)
        if args.json:
            print(json.dumps({"box": st.as_json(), "router": router or "added"}))
        else:
            print(f"box {args.name!r} added ({'serving' if st.serving else st.state or 'not serving'}, "
                  f"{st.slots} slots); router: {router or 'added without a restart'}")
        return 0
    if cmd == "remove":
        router = remove_box(state_dir, args.name, who=oplog.CLI)
        print(json.dumps({"removed": args.name, "router": router or "ok"}) if args.json else
              f"box {args.name!r} removed; router: {router or 'let it go without a restart'}")
        return 0
    cfg = _loaded(state_dir)
    if cmd == "list":
        if args.json:
            print(json.dumps([{"name": b.name, "url": b.url, "metrics_url": b.metrics_url} for b in cfg.boxes]))
        else:
            for b in cfg.boxes:
                print(f"{b.name:<16} {b.url:<32} {b.metrics_url or '-'}")
            if not cfg.boxes:
                print("no boxes yet: `moet-panel fleet add NAME URL`")
        return 0
    if cmd == "status":
        health = {str(w.get("url", "")).rstrip("/"): w.get("is_healthy") for w in RouterAdmin(cfg).workers()}
        rows = []
        for b in cfg.boxes:
            st = box_status(b, cfg.fleet_key)
            rows.append({**st.as_json(), "router_healthy": health.get(b.url.rstrip("/"))})
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            for r in rows:
                state = "serving" if r["serving"] else (r["error"] or r["state"] or "not serving")
                print(f"{r['name']:<16} {state:<24} slots {r['slots']:<4} in flight {r['in_flight']:<4} "
                      f"router: {'healthy' if r['router_healthy'] else 'not listed' if r['router_healthy'] is None else 'unhealthy'}")
        return 0
    if cmd == "prometheus-config":
        text = render(cfg, rule_files=args.rules, interval_s=args.interval,
                      token_dir=Path(args.out).parent if args.out else None)
        if args.out:
            from app.backend.files.atomic import atomic_write

            atomic_write(Path(args.out), text, mode=0o600)
            print(f"wrote {args.out}", file=sys.stderr)
        else:
            print(text, end="")
        return 0
    if cmd == "serve":
        return _serve(args, state_dir)
    raise FleetError(f"unknown action {cmd!r}")


def _say_serving(server: object, state_dir: Path, within_s: float = 120.0) -> None:
    """One JSON line once the front serves through every box of the fleet file (the router lists each healthy),
    or what it has after `within_s`: scripts and tests wait for it instead of guessing."""
    from app.backend.gateway.server import GatewayServer

    assert isinstance(server, GatewayServer)
    end = time.monotonic() + within_s
    healthy = 0
    while time.monotonic() < end:
        cfg = fleetfile.load(state_dir)
        if cfg is not None and server.started:
            healthy = sum(1 for w in RouterAdmin(cfg).workers() if w.get("is_healthy"))
            if server.app.engine.status().accepts and healthy >= len(cfg.boxes):
                break
        time.sleep(0.2)
    print(json.dumps({"serving": healthy}), flush=True)


def _serve(args: argparse.Namespace, state_dir: Path) -> int:
    """The front in the foreground: the router supervised on a thread, the gateway in front of it (the panel runs
    the same parts: docs/fleet.md#what-runs-where)."""
    from app.backend.fleet.front import front_server
    from app.backend.fleet.router import RouterSupervisor
    from app.backend.gateway.keys import KeyStore
    from app.backend.gateway.server import GatewayConfig, GatewayConfigError

    _loaded(state_dir)
    sup = RouterSupervisor(state_dir, lambda: fleetfile.load(state_dir), who=oplog.CLI)
    keys = KeyStore(state_dir)
    try:
        limits = replace(Limits(), max_concurrent=max(1, args.max_concurrent), rate_per_min=max(0.1, args.rate))
        server = front_server(GatewayConfig(host=args.host, port=args.port, insecure_http=args.insecure_http,
                                            limits=limits), keys, state_dir)
    except (GatewayConfigError, ValueError) as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        keys.close()
        return 2
    server.app.who = oplog.CLI

    def stop_on_sigterm(signum: int, frame: object) -> None:
        # uvicorn re-raises the SIGTERM it caught once it has stopped: end by the `finally` below (the router
        # stopped in order), not by the default handler
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    sup.start()
    print(json.dumps({"listening": server.url, "port": server.port}), flush=True)
    threading.Thread(target=_say_serving, args=(server, state_dir), name="front-serving", daemon=True).start()
    try:
        server.run()
    finally:
        sup.stop()
        keys.close()
    return 0
