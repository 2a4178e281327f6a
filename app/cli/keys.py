"""`moet-panel keys create NAME [--expires-days N] [--scope inference|metrics|fleet] [--key-stdin] [--max-tokens N]
| set NAME --max-tokens N | revoke NAME | list`: the API gateway's keys.

The key is printed once, at creation (JSON field `key` with --json); only its SHA-256 is stored, in
`<data-dir>/.moet-panel/gateway.sqlite` (0600). docs/gateway.md#keys.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from app.backend import oplog
from app.backend.gateway.keys import DEFAULT_SCOPE, SCOPES, KeyInfo, KeyStore, KeyStoreError
from app.backend.config.settings import Settings
from app.cli.main import add_common, settings_from


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("keys", help="API keys of the gateway: create (shown once), revoke, list with usage")
    add_common(p)
    ks = p.add_subparsers(dest="keys_cmd", metavar="ACTION", required=True)
    c = ks.add_parser("create", help="create a key; it is printed once and never again")
    c.add_argument("name", help="1-64 letters, digits, '.', '_' or '-'")
    c.add_argument("--expires-days", type=float, metavar="N", help="the key stops working after N days")
    c.add_argument("--scope", choices=SCOPES, default=DEFAULT_SCOPE, help="inference: the gateway (default); "
                   "metrics: the panel's /metrics for Prometheus when the panel has a login (docs/metrics.md#access); "
                   "fleet: a fleet's front (this box then serves the front alone; docs/fleet.md#trust)")
    c.add_argument("--key-stdin", action="store_true", help="accept the key read from stdin (the fleet key the "
                   "front printed: `moet-panel fleet key`) instead of making a new one")
    c.add_argument("--max-tokens", type=int, metavar="N", help="this key's max_tokens cap a request (default: the "
                   "gateway's --max-tokens)")
    st = ks.add_parser("set", help="change a key's own caps (a running gateway applies them within a second)")
    st.add_argument("name")
    st.add_argument("--max-tokens", type=int, metavar="N", required=True,
                    help="this key's max_tokens cap a request; 0: the gateway's cap again")
    r = ks.add_parser("revoke", help="revoke a key (a running gateway refuses it within a second)")
    r.add_argument("name")
    ks.add_parser("list", help="keys with their usage (requests, tokens, errors, last used)")
    for action in ks.choices.values():  # `keys create -h` lists the common options too
        add_common(action)
    p.set_defaults(func=run)


def cli_settings(args: argparse.Namespace) -> Settings:
    """Demo mode decided as for every other subcommand (one data dir for panel and CLI)."""
    from app.backend.telemetry.hostprobe import detect_demo

    return settings_from(args, demo_reason=detect_demo(bool(getattr(args, "demo", False))))


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"


def run(args: argparse.Namespace) -> int:
    store = KeyStore(cli_settings(args).ensure_state_dir())
    try:
        if args.keys_cmd == "create":
            given = sys.stdin.readline().strip() if getattr(args, "key_stdin", False) else None
            created = store.create(args.name, args.expires_days, scope=getattr(args, "scope", DEFAULT_SCOPE),
                                   who=oplog.CLI, max_tokens=getattr(args, "max_tokens", None), key=given)
            if given is not None:
                print(f"key {created.name!r} ({created.scope}) accepted" + (
                    "; this box now serves its fleet's front only" if created.scope == "fleet" else ""))
            elif args.json:
                print(json.dumps({"name": created.name, "key": created.key, "scope": created.scope,
                                  "expires": created.expires}))
            else:
                print(created.key)
                print(f"# key {created.name!r} created; this is the only time it is shown. "
                      + (f"It expires {_when(created.expires)}." if created.expires else "It does not expire."),
                      flush=True)
            return 0
        if args.keys_cmd == "set":
            ok = store.set_max_tokens(args.name, args.max_tokens or None, who=oplog.CLI)
            if args.json:
                print(json.dumps({"name": args.name, "max_tokens": args.max_tokens or None, "set": ok}))
            elif ok:
                print(f"key {args.name!r}: max_tokens cap {args.max_tokens or 'of the gateway'}")
            else:
                print(f"moet-panel: no active key named {args.name!r} (see `moet-panel keys list`)", file=sys.stderr)
            return 0 if ok else 1
        if args.keys_cmd == "revoke":
            ok = store.revoke(args.name, who=oplog.CLI)
            if args.json:
                print(json.dumps({"name": args.name, "revoked": ok}))
            elif ok:
                print(f"key {args.name!r} revoked; a running gateway refuses it within a second")
            else:
                print(f"moet-panel: no active key named {args.name!r} (see `moet-panel keys list`)", file=sys.stderr)
            return 0 if ok else 1
        infos = store.infos()
        if args.json:
            print(json.dumps([i.as_json() for i in infos], indent=2))
        else:
            _table(infos)
        return 0
    except KeyStoreError as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()


def _table(infos: list[KeyInfo]) -> None:
    if not infos:
        print("no keys yet: `moet-panel keys create NAME`")
        return
    print(f"{'name':<20} {'status':<8} {'requests':>8} {'prompt tok':>10} {'compl tok':>10} {'errors':>6} "
          f"{'max tok':>8}  last used")
    for i in infos:
        u = i.usage
        print(f"{i.name:<20} {i.status:<8} {u.requests:>8} {u.prompt_tokens:>10} {u.completion_tokens:>10} "
              f"{u.errors:>6} {i.max_tokens or '-':>8}  {_when(u.last_used)}")
