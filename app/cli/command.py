"""`moet-panel command --profile ID`: print the docker run the panel would execute."""

from __future__ import annotations

import argparse
import sys

from app.backend.engine.builds import store as builds

from app.backend.profiles.registry import ProfileRegistry
from app.backend.recipe.command import build_run_spec, render_explained, render_json, render_shell
from app.cli.main import add_common, settings_from


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("command", help="print the docker run for a profile")
    add_common(p, json_help="the command as JSON (same as --format json)")
    p.add_argument("--profile", required=True, help="profile id (e.g. quality, balanced, speed)")
    p.add_argument("--plain", action="store_true", help="exactly the card's command: no panel labels or trace env")
    p.add_argument("--format", choices=["shell", "json"], default="shell")
    p.add_argument("--build", metavar="ID", help="the engine build (default: the current one: the recipe's pin "
                   "until a promotion; `moet-panel engine builds`)")
    p.add_argument("--explain", action="store_true",
                   help="print each line with the card's reason for it (\"why each knob\"), or why the panel adds it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    try:  # the image of the build a start runs (engine/builds/store.py: the one place it is chosen)
        build = builds.registry(settings).resolve(args.build)
    except builds.UnknownBuild as exc:
        print(f"moet-panel: {exc.args[0]}", file=sys.stderr)
        return 2
    spec = build_run_spec(  # custom profiles saved in the data dir count too (the one registry)
        settings.recipe, args.profile, str(settings.data_dir), plain=args.plain, profiles=ProfileRegistry(settings).list(),
        image=build.image, build=build.id,
    )
    if args.explain:
        print(render_explained(settings.recipe, spec))
    else:
        print(render_json(spec) if args.format == "json" or args.json else render_shell(spec))
    return 0
