"""`moet-panel service install [--user]`: run the panel as a systemd service (docs/engine.md, "Run as a service")."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app.backend.service import systemd
from app.cli.main import add_common

REPO = Path(__file__).resolve().parents[2]


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("service", help="run the panel as a systemd service (install the unit)")
    sp = p.add_subparsers(dest="service_cmd", metavar="ACTION", required=True)
    inst = sp.add_parser("install", help="write the systemd unit, enable and start it")
    inst.add_argument("--user", action="store_true", help="a user unit (~/.config/systemd/user), no root needed")
    inst.add_argument("--unit-path", type=Path, default=None, help="write the unit here instead (no enable)")
    inst.add_argument("--no-enable", action="store_true", help="write the unit only; print what to run")
    inst.add_argument("--print", dest="print_only", action="store_true", help="print the unit and exit")
    inst.add_argument("serve_args", nargs=argparse.REMAINDER,
                      help="arguments for `moet-panel serve` in the unit (after --), e.g. -- --data-dir /srv/moet")
    sp.add_parser("status", help="the restart policy and where alerts go (URLs masked)")
    add_common(p, json_help="(accepted; the unit is printed as text)")
    for action in sp.choices.values():  # `service install -h` lists the common options too
        add_common(action, json_help="(accepted; the unit is printed as text)")
    p.set_defaults(func=run)


def common_serve_args(args: argparse.Namespace) -> list[str]:
    """The common options given to `service install` go into the unit's `serve` command: the same effect
    as on every other subcommand (the service serves that recipe, data dir or demo mode)."""
    out: list[str] = []
    if getattr(args, "recipe", None):
        out += ["--recipe", str(Path(args.recipe).expanduser().resolve())]
    if getattr(args, "data_dir", None):
        out += ["--data-dir", str(Path(args.data_dir).expanduser().resolve())]
    if getattr(args, "demo", False):
        out.append("--demo")
    return out


def _data_dir(args: argparse.Namespace, serve_args: list[str]) -> Path:
    """The data dir the service will use (its ReadWritePaths=): `--data-dir` in the serve arguments, else what
    `serve` with these common options resolves (flag, MOET_PANEL_DATA_DIR, the recipe's default)."""
    for i, a in enumerate(serve_args):
        if a == "--data-dir" and i + 1 < len(serve_args):
            return Path(serve_args[i + 1]).expanduser().absolute()
        if a.startswith("--data-dir="):
            return Path(a.split("=", 1)[1]).expanduser().absolute()
    from app.cli.main import settings_from

    return settings_from(args).data_dir


def status(args: argparse.Namespace) -> int:
    """What the Service tab shows of the settings, for a shell: the URLs through the one masking function."""
    from app.backend.redact import mask_url
    from app.backend.service.config import ServiceConfigStore, effective_notify_urls, effective_policy
    from app.cli.main import settings_from

    settings = settings_from(args)
    store = ServiceConfigStore(settings.state_dir)
    policy, psrc = effective_policy(store, settings.recipe.engine.restart)
    urls, usrc = effective_notify_urls(store)
    print(f"restart policy : {policy} (from the {psrc})")
    print(f"alerts go to   : {', '.join(mask_url(u) for u in urls) or 'nobody (add an Apprise URL in the Service tab)'}"
          + (f" ({usrc})" if urls else ""))
    print(f"settings file  : {store.path}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.service_cmd == "status":
        return status(args)
    serve_args = common_serve_args(args) + [a for a in args.serve_args if a != "--"]
    data_dir = _data_dir(args, serve_args)
    spec = systemd.default_spec(args.user, serve_args, REPO, systemd.current_python(), data_dir)
    if not args.user and str(data_dir).startswith(("/tmp/", "/var/tmp/")):
        print(f"moet-panel: warning: the data dir {data_dir} is under /tmp: the unit's PrivateTmp=yes gives the panel "
              "a private /tmp that Docker does not see (the engine's mounts would miss it); pick another --data-dir",
              file=sys.stderr)
    if args.print_only:
        print(systemd.unit_text(spec), end="")
        return 0
    if not args.user and args.unit_path is None and not _can_write("/etc/systemd/system"):
        print("moet-panel: writing /etc/systemd/system needs root: run with sudo, or use --user", file=sys.stderr)
        return 2
    res = systemd.install(spec, args.unit_path, enable=not args.no_enable and args.unit_path is None)
    print("\n".join(res.lines))
    return 0


def _can_write(path: str) -> bool:
    import os

    return os.access(path, os.W_OK)
