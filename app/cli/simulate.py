"""`moet-panel simulate-engine`: run the SIMULATED vLLM-Moet engine in the foreground, or build its image.

The engine is configured exactly as the panel would start the container for a profile: the profile's
env (VLLM_MOE_W2_* knobs, DELTA_TRACE=1, MOET_SIM_DECODE_TOK_S = the profile's decode figure) and the
recipe's engine args. Variables already set in this shell (MOET_SIM_*, VLLM_MOE_W2_*) win, like
`docker run -e` overrides in the real recipes image.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from app.backend import env
from app.backend.recipe.command import build_run_spec
from app.backend.simengine import FAIL_MODES, SimEngineServer, config_from_env_and_args
from app.cli.main import add_common, settings_from

OVERRIDE_PREFIXES = ("MOET_SIM_", "VLLM_MOE_W2")


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("simulate-engine", help="run the SIMULATED engine (no GPU) or build its Docker image")
    add_common(p, json_help="accepted; the simulated engine prints its log, no data")
    p.add_argument("--port", type=int, help="listen port (default: the recipe's, 8000)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--profile", help="profile id whose env and decode speed to simulate (default: the recommended one)")
    p.add_argument("--decode-tok-s", type=float, help="override the profile's decode tok/s")
    p.add_argument("--boot-s", type=float, help="override the simulated load time (MOET_SIM_BOOT_S)")
    p.add_argument("--fail", choices=FAIL_MODES, help="failure mode to simulate (MOET_SIM_FAIL)")
    p.add_argument("--build-image", action="store_true", help="build the moet-panel/sim-engine:2 image and exit")
    p.add_argument("--rebuild", action="store_true", help="with --build-image: rebuild even if up to date")
    p.set_defaults(func=run)


def _resolve(args: argparse.Namespace):
    recipe = args.recipe or env.recipe()
    if recipe is None:
        from app.backend.recipe import SIMULATED_RECIPE

        recipe = SIMULATED_RECIPE  # simulating the engine: the simulated recipe unless told otherwise
    return settings_from(args, recipe_fallback=recipe)


def engine_environment(args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """The engine argv and env this command runs the simulation with."""
    settings = _resolve(args)
    recipe = settings.recipe
    profile_id = args.profile or recipe.recommended_profile.id
    spec = build_run_spec(recipe, profile_id, str(settings.data_dir), profiles=settings.profiles.list())
    sim_env = dict(spec.env)
    sim_env.update(env.inherited(prefixes=OVERRIDE_PREFIXES))
    if args.decode_tok_s:
        sim_env["MOET_SIM_DECODE_TOK_S"] = str(args.decode_tok_s)
    if args.boot_s is not None:
        sim_env["MOET_SIM_BOOT_S"] = str(args.boot_s)
    if args.fail:
        sim_env["MOET_SIM_FAIL"] = args.fail
    # a standalone simulation listens where this command's --host/--port say (TCP): the panel's own engine, on
    # its unix socket, is the one the panel starts (docs/engine.md, "Where the engine listens")
    argv = list(spec.command.remove_arg("--uds").args)
    if args.port is not None:
        argv += ["--port", str(args.port)]  # last one wins, as with vLLM's argparse
    return argv, sim_env


def run(args: argparse.Namespace) -> int:
    if args.build_image:
        from app.backend.simengine.image import ImageBuildError, ensure_image

        try:
            tag = ensure_image(rebuild=args.rebuild, progress=lambda line: print(line, flush=True))
        except ImageBuildError as exc:
            print(f"moet-panel: {exc}", file=sys.stderr)
            return 1
        except Exception as exc:  # docker-py: daemon down / socket missing (DockerException, requests errors)
            print(f"moet-panel: cannot reach the Docker engine to build the image: {exc}", file=sys.stderr)
            return 1
        print(f"built {tag} (SIMULATED engine image)")
        return 0
    argv, env = engine_environment(args)
    cfg = config_from_env_and_args(argv, env)
    cfg.host = args.host
    server = SimEngineServer(cfg)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.stop, daemon=True).start())
    try:
        server.start()
    except OSError as exc:
        print(f"moet-panel: cannot listen on {cfg.host}:{cfg.port}: {exc.strerror}", file=sys.stderr)
        return 1
    print(f"SIMULATED engine on {server.base_url} (profile env, {cfg.decode_tok_s:g} tok/s); Ctrl-C stops",
          file=sys.stderr, flush=True)
    try:
        code = None
        while code is None:
            code = server.wait(0.5)
    except KeyboardInterrupt:
        server.stop()
        code = 0
    return code
