"""`moet-panel serve`: start the web panel (loopback by default; auth required for anything else).

Decides demo mode (no usable GPU or Docker → simulated engine, per-user demo data dir; the download service
starts the local SIMULATED Hub on first use),
builds the one AppState and the Gradio app, prints a banner (URL, demo yes/no, auth on/off) and blocks.
Gradio is imported only here, inside `run`, so other subcommands stay light.
"""

from __future__ import annotations

import argparse
import getpass
import logging
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from app.backend.web.auth import (SESSION_IDLE_S, SESSION_LIFETIME_S, AuthError, BindingError, add_user, auth_file_warning,
                              check_binding, default_auth_path, load_users, make_checker)
from app.backend import oplog
from app.backend.config import env
from app.backend.telemetry.hostprobe import HostProbe, detect_demo
from app.backend.service.systemd import sd_notify
from app.backend.service.watchdog import Heartbeat, Watchdog, timings
from app.backend.prometheus.access import MetricsTokenError, load_token, token_file
from app.backend.config.settings import Settings
from app.backend.web.gate import parse_allowed_hosts
from app.cli.main import add_common, settings_from

if TYPE_CHECKING:
    from app.backend.contracts import GpuReader
    from app.backend.telemetry.nvml import NvmlGpuReader

log = logging.getLogger("moet_panel.serve")
MAIN_WAKE_S = 5.0  # the main thread only waits for a signal or the page server to close


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("serve", help="start the web panel (http://127.0.0.1:7860)")
    add_common(p, json_help="accepted; serve prints its banner, no data")
    p.add_argument("--host", default=None, help="listen address (default 127.0.0.1; env GRADIO_SERVER_NAME). "
                   "Anything but loopback requires --auth-file")
    p.add_argument("--port", type=int, default=None, help="listen port (default 7860; env GRADIO_SERVER_PORT)")
    p.add_argument("--auth-file", metavar="FILE", help=f"web UI credentials (env {env.AUTH_FILE}); create with --add-user")
    p.add_argument("--allowed-host", metavar="NAME", action="append", default=[],
                   help="also answer to this Host name (a reverse proxy's public name, NAME or NAME:PORT); "
                        f"repeatable; env {env.ALLOWED_HOSTS}=a,b. Loopback names are always allowed")
    p.add_argument("--metrics-token-file", metavar="FILE", help="with --auth-file: the bearer token that opens /metrics "
                   f"(and nothing else) for Prometheus (env {env.METRICS_TOKEN_FILE}); docs/metrics.md")
    p.add_argument("--add-user", metavar="NAME", help="add/replace a user in the auth file (password from prompt or stdin) and exit")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Plan:
    settings: Settings
    demo_reason: str  # '' when not in demo mode
    host: str
    port: int
    auth_file: Path | None
    allowed_hosts: tuple[str, ...] = ()  # extra Host names the HTTP gate serves (app.backend.web.gate)
    metrics_token: str | None = field(default=None, repr=False)  # opens /metrics when auth is on


def _read_password() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("password: ")
        if first != getpass.getpass("again: "):
            raise AuthError("the two passwords differ")
        return first
    return sys.stdin.readline().rstrip("\n")


def plan(args: argparse.Namespace, probe: HostProbe | None = None, gpu_reader: GpuReader | None = None) -> Plan:
    """Resolve everything `serve` needs without starting anything (tested directly). `gpu_reader`: the
    process's one NVML reader, probed for the demo decision and then kept by the app state."""
    host = args.host or env.server_name() or "127.0.0.1"
    port = args.port or env.server_port() or 7860
    auth_src = args.auth_file or env.auth_file()
    auth_file = Path(auth_src).expanduser() if auth_src else None
    if auth_file is not None:
        load_users(auth_file)  # fail early with the file's problem
    check_binding(host, auth_file is not None)
    try:
        allowed_hosts = parse_allowed_hosts(",".join([env.allowed_hosts(), *(getattr(args, "allowed_host", None) or [])]))
    except ValueError as exc:
        raise BindingError(str(exc)) from None
    metrics_file = token_file(getattr(args, "metrics_token_file", None))
    if metrics_file is not None and auth_file is None:
        raise AuthError("--metrics-token-file is for a panel with a login (--auth-file); without one, /metrics is "
                        "open on loopback (docs/metrics.md#access)")
    metrics_token = load_token(metrics_file) if metrics_file is not None else None  # fail early, say why
    demo_reason = detect_demo(args.demo, probe, gpu_reader)  # one rule for serve and every CLI subcommand
    # demo without a recipe → simulated.toml and the per-user demo data dir (resolve_settings)
    settings = settings_from(args, demo_reason=demo_reason)
    return Plan(settings=settings, demo_reason=demo_reason, host=host, port=port, auth_file=auth_file,
                allowed_hosts=allowed_hosts, metrics_token=metrics_token)


def banner(p: Plan, url: str, hub_note: str | None) -> str:
    s = p.settings
    users = len(load_users(p.auth_file)) if p.auth_file else 0
    lines = [
        f"moet-panel is running: {url}",
        f"  recipe   : {s.recipe.id}{' (SIMULATED engine)' if s.recipe.simulated else ''}  [{s.recipe_path}]",
        f"  data dir : {s.data_dir}",
        f"  demo     : {'yes — ' + p.demo_reason if p.demo_reason else 'no (real GPU + Docker)'}",
        f"  auth     : {'on — ' + str(users) + ' user(s) from ' + str(p.auth_file) if p.auth_file else 'off (listening on loopback only)'}",
        *([f"  sessions : bound to the page's origin; end after {SESSION_IDLE_S / 3600:g} h idle or "
           f"{SESSION_LIFETIME_S / 3600:g} h (docs/ui-and-safety.md#sessions)"] if p.auth_file else []),
    ]
    lines.append(f"  hosts    : loopback{''.join(', ' + h for h in p.allowed_hosts)}"
                 + ("  (listening on every address: add --allowed-host NAME for the name browsers use)"
                    if p.host in ("0.0.0.0", "::", "[::]") and not p.allowed_hosts else ""))
    metrics = "bearer token only (--metrics-token-file)" if p.metrics_token else (
        "refused: no --metrics-token-file" if p.auth_file else "open on loopback")
    lines.append(f"  metrics  : {url.rstrip('/')}/metrics — {metrics}")
    if hub_note:
        lines.append(f"  hub      : {hub_note}")
    lines.append("  stop     : Ctrl+C (a running engine container keeps running; the panel adopts it next start)")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.add_user:
        path = Path(args.auth_file or env.auth_file() or default_auth_path()).expanduser()
        try:
            add_user(path, args.add_user, _read_password())
        except AuthError as exc:
            print(f"moet-panel: {exc}", file=sys.stderr)
            return 2
        print(f"user {args.add_user!r} saved in {path} (mode 0600). Start with: moet-panel serve --auth-file {path}")
        return 0
    env.set_default("GRADIO_ANALYTICS_ENABLED", "False")
    env.set_default("HF_HUB_DISABLE_TELEMETRY", "1")
    oplog.configure(None)  # stderr (journald under systemd); the state dir's file joins once it exists
    from app.backend.telemetry.nvml import NvmlGpuReader

    nvml = NvmlGpuReader()  # the process's one NVML client: the host probe reads it, the app state keeps it
    try:
        p = plan(args, gpu_reader=nvml)
    except (AuthError, BindingError, MetricsTokenError) as exc:
        nvml.close()
        print(f"moet-panel: {exc}", file=sys.stderr)
        return 2
    warning = auth_file_warning(p.auth_file) if p.auth_file else None
    if warning:
        print(f"moet-panel: warning: {warning}", file=sys.stderr)
    return _serve(p, nvml)


def wait_until_closed(demo: Any) -> None:
    """Gradio's `block_thread()` without its 0.1 s poll (10 wake-ups a second, docs/ui-and-safety.md "Idle
    cost"): SIGINT/SIGTERM still end the wait at once (their handler raises into the sleep, PEP 475)."""
    while demo.is_running:
        time.sleep(MAIN_WAKE_S)


def _serve(p: Plan, nvml: NvmlGpuReader | None = None) -> int:
    from app.backend.state import build_app_state
    from app.ui.app import build_ui, launch

    try:
        p.settings.ensure_state_dir()
    except OSError as exc:
        if nvml is not None:
            nvml.close()
        print(f"moet-panel: cannot create the panel's state dir {p.settings.state_dir} ({exc.strerror or exc}). "
              "Create the data dir with write access for this user, or pass --data-dir DIR.", file=sys.stderr)
        return 2
    oplog.configure(p.settings.state_dir)
    state = build_app_state(p.settings, nvml_reader=nvml)
    # Demo downloads: the download service starts the SIMULATED local Hub itself on first use.
    hub_note = "SIMULATED local demo Hub on 127.0.0.1 (started on the first download)" if p.settings.recipe.simulated else None
    auth = make_checker(load_users(p.auth_file), on_failure=state.counters.login_failed) if p.auth_file else None
    demo = build_ui(state)
    try:
        url = launch(demo, p.host, p.port, auth, allowed_hosts=p.allowed_hosts, state=state, metrics_token=p.metrics_token)
    except OSError as exc:
        state.close()
        print(f"moet-panel: cannot listen on {p.host}:{p.port} ({exc}). Is another panel running? "
              "Pick another port with --port.", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 (any start-up failure is a clear message, not a traceback)
        demo.close()
        state.close()
        log.debug("start-up failure", exc_info=True)
        print(f"moet-panel: the web server did not start on {p.host}:{p.port} ({type(exc).__name__}: {exc}). "
              "Try --host 127.0.0.1 (with an SSH tunnel) or another --host/--port.", file=sys.stderr)
        return 2
    print(banner(p, url, hub_note), flush=True)
    # Under systemd (Type=notify): ready once the page answers; on SIGTERM say "stopping" and close the panel's
    # threads only — the engine keeps serving (docs/engine.md, "Run as a service").
    # The handler goes in before READY: a SIGTERM sent the moment systemd (or a test) reads READY must stop
    # the panel cleanly, not kill it with the default action.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    oplog.decision("panel", "started", who=oplog.CLI, url=url, demo=bool(p.demo_reason), auth=p.auth_file is not None,
                   recipe=p.settings.recipe.id)
    watchdog = None
    try:
        sd_notify("READY=1\nSTATUS=panel at " + url)
        # after READY: systemd arms the watchdog once the start is complete (a slow start is TimeoutStartSec's)
        watchdog = start_watchdog(state, lambda: bool(demo.is_running))
        wait_until_closed(demo)
    except KeyboardInterrupt:
        oplog.decision("panel", "stopping", who=oplog.OUTSIDE, reason="SIGTERM or Ctrl+C")
    finally:
        sd_notify("STOPPING=1")
        if watchdog is not None:
            watchdog.close()
        demo.close()
        state.close()
    oplog.decision("panel", "stopped", who=oplog.PANEL)
    return 0


def start_watchdog(state: Any, alive: Callable[[], bool]) -> Watchdog | None:
    """systemd's watchdog when the unit asks for one ($WATCHDOG_USEC): pings earned by the engine reconciler's
    heartbeat, or by the page server alone when there is no engine controller (app/backend/service/watchdog.py)."""
    usec = env.watchdog_usec()
    if usec is None:
        return None
    interval_s, stale_s = timings(usec)
    engine = state.engine if isinstance(state.engine, Heartbeat) else None
    oplog.decision("panel", "watchdog_on", who=oplog.PANEL, period_s=usec / 1e6,
                   earned_by="engine reconciler heartbeat" if engine is not None else "panel liveness")
    return Watchdog(sd_notify, interval_s=interval_s, stale_s=stale_s, engine=engine, alive=alive).start()
