"""`moet-panel logs --panel [-f] [-n N]`: the operator's log (every decision and caught error, key=value).

The same lines go to stderr (journald under systemd: `journalctl -u moet-panel`); this reads the rotated
copy in the state dir, so it works without systemd and for a panel started by hand (docs/engine.md
"The operator's log"). The engine's own log is `moet-panel engine logs`.
"""

from __future__ import annotations

import argparse
import sys

from app.backend import oplog
from app.cli.keys import cli_settings
from app.cli.main import add_common


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("logs", help="the panel's operator log (decisions, restarts, alerts, caught errors)")
    add_common(p, json_help="accepted; the lines are key=value already")
    p.add_argument("--panel", action="store_true", help="the panel's own log (the only one here; the engine's "
                   "is `moet-panel engine logs`)")
    p.add_argument("-n", "--lines", type=int, default=200, metavar="N", help="how many of the last lines (default 200)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines (Ctrl+C ends)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    state_dir = cli_settings(args).state_dir
    path = oplog.log_path(state_dir)
    if not path.exists() and not args.follow:
        print(f"moet-panel: no operator log yet at {path} (a panel writes it once it runs with this data dir)",
              file=sys.stderr)
        return 1
    for line in oplog.read_lines(state_dir, args.lines):
        print(line)
    if args.follow:
        try:
            for line in oplog.follow(state_dir):
                print(line, flush=True)
        except KeyboardInterrupt:
            return 0
    return 0
