"""`moet-panel` command line. Each subcommand lives in its own module exposing `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import sys

from app.backend.recipe import RecipeError
from app.backend.recipe.command import CommandError

# Subcommand modules, in help order. Each defines register(subparsers) and sets `func` on its parser.
SUBCOMMANDS = [
    "app.cli.serve",
    "app.cli.command",
    "app.cli.download",
    "app.cli.engine",
    "app.cli.telemetry",
    "app.cli.trace",
    "app.cli.chat",
    "app.cli.simulate",
]


def add_common(parser: argparse.ArgumentParser) -> None:
    """--recipe/--data-dir, accepted by every subcommand (env: MOET_PANEL_RECIPE / MOET_PANEL_DATA_DIR)."""
    parser.add_argument("--recipe", metavar="FILE", help="recipe TOML (env MOET_PANEL_RECIPE)")
    parser.add_argument("--data-dir", metavar="DIR", help="data dir (env MOET_PANEL_DATA_DIR; default from recipe)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moet-panel", description="Control panel for a vLLM-Moet GPU box.")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # subcommand not part of this build
                continue
            raise
        module.register(subs)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (RecipeError, CommandError) as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:  # unknown profile / artifact ids carry a full sentence
        print(f"moet-panel: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
