"""`moet-panel` command line. Each subcommand lives in its own module exposing `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from app.backend.config import env

if TYPE_CHECKING:
    from app.backend.config.settings import Settings

# Subcommands: name -> (module, one-line help). Only the chosen subcommand's module is imported, so a
# quick command does not pay for the others' heavy imports (openai, gradio, docker...).
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("app.cli.serve", "start the web panel (http://127.0.0.1:7860)"),
    "command": ("app.cli.command", "print the docker run for a profile"),
    "download": ("app.cli.download", "download, verify and extract the recipe's artifacts"),
    "engine": ("app.cli.engine", "control the serving engine (Docker container)"),
    "telemetry": ("app.cli.telemetry", "print GPU + host samples (NVML, psutil)"),
    "trace": ("app.cli.trace", "read the engine's FP4 pool trace ([delta] tick lines)"),
    "chat": ("app.cli.chat", "stream one answer from the engine (or any OpenAI-compatible server)"),
    "simulate-engine": ("app.cli.simulate", "run the SIMULATED engine (no GPU) or build its Docker image"),
    "selftest": ("app.cli.selftest", "measure the running profile against the card (decode, TTFT, needles)"),
    "abtest": ("app.cli.abtest", "blind A/B of two profiles on your own prompts (journalled, resumable)"),
    "gateway": ("app.cli.gateway", "serve the model to other machines: API keys, limits, usage (foreground)"),
    "fleet": ("app.cli.fleet", "several boxes behind one endpoint: the boxes, the router, Prometheus (docs/fleet.md)"),
    "keys": ("app.cli.keys", "API keys of the gateway: create (shown once), revoke, list with usage"),
    "service": ("app.cli.service", "run the panel as a systemd service (install the unit)"),
    "logs": ("app.cli.logs", "the panel's operator log (decisions, restarts, alerts, caught errors)"),
}


def add_common(parser: argparse.ArgumentParser, json_help: str = "machine-readable output (JSON)") -> None:
    """--recipe/--data-dir/--demo/--json, accepted by every subcommand at any position (env: MOET_PANEL_RECIPE /
    MOET_PANEL_DATA_DIR / MOET_PANEL_DEMO); main() lifts them out of argv, these entries are for --help."""
    g = parser.add_argument_group("accepted by every subcommand, at any position")
    g.add_argument("--recipe", metavar="FILE", help="recipe TOML (env MOET_PANEL_RECIPE)")
    g.add_argument("--data-dir", metavar="DIR", help="data dir (env MOET_PANEL_DATA_DIR; default from recipe)")
    g.add_argument("--demo", action="store_true", help="demo mode: the SIMULATED recipe, engine, GPU and Hub, and the "
                   "per-user demo data dir (never the real one; env MOET_PANEL_DEMO=1)")
    g.add_argument("--json", action="store_true", help=json_help)


def settings_from(args: argparse.Namespace, recipe_fallback: str | Path | None = None,
                  demo_reason: str = "") -> Settings:
    """The one place a subcommand turns the common options into Settings: flags, then the environment,
    then the recipe's defaults; --demo (or MOET_PANEL_DEMO=1) picks the SIMULATED recipe and the per-user
    demo data dir unless --recipe/--data-dir say otherwise (app.backend.config.settings.resolve_settings)."""
    from app.backend.config.settings import resolve_settings

    demo = bool(getattr(args, "demo", False)) or bool(demo_reason)
    return resolve_settings(getattr(args, "recipe", None) or env.recipe() or recipe_fallback,
                            getattr(args, "data_dir", None), demo=demo, demo_reason=demo_reason)


# Accepted at any level (`moet-panel engine start --profile quality --demo` == `moet-panel --demo engine start
# ...`): lifted out of argv before argparse sees it, then set on the parsed namespace (README "Command line").
GLOBAL_VALUE_OPTIONS = {"--recipe": "recipe", "--data-dir": "data_dir"}
GLOBAL_SWITCHES = {"--demo": "demo", "--json": "json"}


def hoist_global_options(argv: list[str]) -> tuple[list[str], dict[str, object]]:
    """Remove --recipe/--data-dir/--demo/--json from anywhere in argv (until `--`); return (rest, values)."""
    rest: list[str] = []
    found: dict[str, object] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            rest += argv[i:]
            break
        name, eq, val = a.partition("=")
        if name in GLOBAL_VALUE_OPTIONS:
            if not eq:
                if i + 1 >= len(argv):
                    raise SystemExit(f"moet-panel: {name} needs a value")
                val = argv[i + 1]
                i += 1
            found[GLOBAL_VALUE_OPTIONS[name]] = val
        elif a in GLOBAL_SWITCHES:
            found[GLOBAL_SWITCHES[a]] = True
        else:
            rest.append(a)
        i += 1
    return rest, found


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser for `only` (or for every subcommand when None); others get a help-only stub."""
    parser = argparse.ArgumentParser(prog="moet-panel", description="Control panel for a vLLM-Moet GPU box.")
    subs = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).register(subs)
        else:
            subs.add_parser(name, help=help_text)
    return parser


def parse(argv: list[str], hoisted: dict[str, object] | None = None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser for argv's subcommand and the parsed options, the common ones set wherever they stood."""
    if hoisted is None:
        argv, hoisted = hoist_global_options(list(argv))
    chosen = next((a for a in argv if not a.startswith("-")), "")
    parser = build_parser(only=chosen if chosen in SUBCOMMANDS else "")
    args = parser.parse_args(argv)
    for key in ("recipe", "data_dir", "demo", "json"):
        setattr(args, key, hoisted.get(key, None if key in ("recipe", "data_dir") else False))
    return parser, args


def main(argv: list[str] | None = None) -> int:
    """The `moet-panel` entry. A reader that goes away (`moet-panel engine status | head`) ends it quietly, as a
    Unix tool ends on SIGPIPE: no BrokenPipeError traceback (issue 49). Python ignores SIGPIPE, so the write
    raises instead; stdout is pointed at /dev/null so the interpreter's last flush fails no more (Python's
    documentation, "Note on SIGPIPE")."""
    try:
        return _main(argv)
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # stdout has no descriptor (a test's capture): nothing more to flush
            pass
        return 128 + signal.SIGPIPE


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    argv, hoisted = hoist_global_options(list(argv))
    chosen = next((a for a in argv if not a.startswith("-")), "")
    if chosen == "download":  # its artifact processes' forkserver imports beside this process's imports
        from app.backend.download.procs import start_early_on_many_cores
        start_early_on_many_cores()
    # imported after the forkserver has started: the recipe's pydantic models take ~0.15 s to build
    from app.backend.recipe import RecipeError
    from app.backend.recipe.command import CommandError
    from app.backend.contracts import GpuCountError
    parser, args = parse(argv, hoisted)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (RecipeError, CommandError, GpuCountError) as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:  # unknown profile / artifact ids carry a full sentence
        print(f"moet-panel: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
