"""One SIMULATED box of a fleet, run inside its own network namespace by tests/fleet and bench/fleet/run.py:

    ip netns exec NS python -m bench.fleet.simbox --data DIR --host ADDR --port PORT --recipe FILE [--slots N]
        [--metrics-port P --metrics-token-file F]

What a box's panel runs for its gateway, without the web page: the engine controller (the SIMULATED engine on the
process runtime, a child of this process: it listens on its unix socket, so the namespace changes nothing for it),
the gateway on the namespace's address with the panel's status of the engine (`SnapshotSource`) and its answers
counted for the drain, and the fleet key read from stdin's first line (scope `fleet`: the box serves the front
alone). Then one JSON line per event on stdout: {"ready": ...} once the engine serves; commands on stdin:
`switch PROFILE`, `upgrade BUILD` (what the owner does from the Engine tab or the CLI: `engine build-image
--commit BUILD --demo`, then `engine promote BUILD`: the switch to it drains as a profile switch does), `rollback`
(`engine rollback`), `tokens` (the engine's own generation and prompt counters, and what the gateway billed the
fleet key), `canary SECONDS` (the generation canary's interval, 0: off), `quit`. With `--metrics-port`, the
panel's `/metrics` on ADDR:P behind its token (bench/fleet/boxmetrics.py), for the fleet's Prometheus.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def say(**kw: object) -> None:
    print(json.dumps(kw), flush=True)


def engine_tokens(base_url: str, counter: str = "vllm:generation_tokens_total") -> float:
    """A token counter of the engine (its /metrics over its socket): generated, or `vllm:prompt_tokens_total`."""
    from app.backend.engine.runtime.client import engine_client

    total = 0.0
    for line in engine_client(base_url).metrics().text.splitlines():
        if line.startswith(counter):
            total += float(line.rsplit(" ", 1)[1])
    return total


def engine_sim_builds() -> list[str]:
    """MOET_SIM_BUILD of each engine process this box runs now (its children on the process runtime): what the build
    switched to really runs, not only its label ("" for the pinned build)."""
    import psutil

    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "simengine" in " ".join(child.cmdline()):
                out.append(child.environ().get("MOET_SIM_BUILD", ""))
        except psutil.Error:
            continue
    return out


def upgrade(settings: Any, ctl: Any, build: str) -> dict[str, object]:
    """`build` built and promoted, or ("") the last promotion rolled back, through the calls the CLI and the Engine
    tab make (app/cli/engine.py `_build_commit` / `_promote`, engine/builds/job.py `BuildService`): the build's mark,
    `build_demo`, `upgrade.promote` / `upgrade.rollback`, whose switch drains. Answers once the engine serves again."""
    import time

    from app.backend import oplog
    from app.backend.engine import upgrade as up
    from app.backend.engine.builds import job
    from app.backend.engine.builds.image import build_mark

    t0 = time.monotonic()
    if build:
        # this box is a machine without Docker (its engine runs on the process runtime, above), so the build takes the
        # product's no-Docker path: recorded with no image, its engine process gets MOET_SIM_BUILD (docs/engine.md
        # "Demo mode"); this test machine's own Docker must not build an image for it
        job._docker_reachable = lambda: False
        mark = build_mark(settings.ensure_state_dir(), build)
        try:
            built = job.build_demo(settings, build, lambda ev: None)
        finally:
            mark.release()
        if not built.result.ok or built.build is None:
            return {"error": f"build {build}: {built.result.message}"}
        out = up.promote(ctl, built.build.id, oplog.CLI)
    else:
        out = up.rollback(ctl, oplog.CLI)
    if out.ticket is None:
        return {"error": f"build {out.current} is current but no engine was switched to it (none served)"}
    if not out.ticket.accepted:
        return {"error": f"the switch to build {out.current} was refused: {out.ticket.message}"}
    out.ticket.wait(180)
    s = ctl.snapshot()
    return {"upgraded": s.build, "ok": out.ticket.ok, "message": out.ticket.message, "current": out.current,
            "previous": out.previous, "ready": s.is_ready, "engine_sim_build": engine_sim_builds(),
            "profile": s.profile_id, "seconds": round(time.monotonic() - t0, 2)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--recipe", required=True)
    ap.add_argument("--profile", default="quality")
    ap.add_argument("--metrics-port", type=int, default=0, help="serve the panel's /metrics there (0: none)")
    ap.add_argument("--metrics-token-file", default="", help="its bearer token (0600), as --metrics-token-file")
    args = ap.parse_args()
    os.environ["MOET_PANEL_GPU"] = "simulated"
    fleet_key = sys.stdin.readline().strip()

    from app.backend import oplog
    from app.backend.config.settings import resolve_settings
    from app.backend import state as wiring
    from app.backend.engine.runtime import choice
    from app.backend.engine.lifecycle.tickets import ControllerOptions
    from app.backend.engine.runtime.process import ProcessRuntime
    from app.backend.files.atomic import LockBusy
    from app.backend.gateway.engine_status import SnapshotSource
    from app.backend.gateway.keys import KeyStore
    from app.backend.gateway.proxy import Limits
    from app.backend.gateway.server import GatewayConfig, GatewayServer, engine_slots_of
    from app.backend.telemetry.gpu import follow_engine, make_gpu_reader

    # the process runtime, as a box without Docker runs it (runtime/choice.select_runtime would take this machine's
    # Docker; the test's boxes must be processes of their namespace)
    choice.select_runtime = lambda settings, allow_process=True: (ProcessRuntime(settings.state_dir), "")  # type: ignore[assignment]
    settings = resolve_settings(args.recipe, Path(args.data), demo=True)
    state_dir = settings.ensure_state_dir()
    oplog.configure(state_dir)
    reader = make_gpu_reader(settings)
    ctl = wiring.make_engine_controller(settings, reader, ControllerOptions(actor="CLI"), supervise=True)
    follow_engine(reader, ctl)
    keys = KeyStore(state_dir)
    if fleet_key:
        keys.create("front", scope="fleet", key=fleet_key, who=oplog.CLI)

    def slots_for(pid: str) -> int:
        return engine_slots_of(settings.recipe, next((p for p in settings.recipe.profiles if p.id == pid), None))

    source = SnapshotSource(ctl.snapshot, "http://127.0.0.1:9", slots_for)
    from bench.fleet.boxmetrics import BoxMetrics, GatewayFigures

    figures = GatewayFigures(keys)  # the gateway's reports, as the panel keeps its gateway process's
    server = GatewayServer(GatewayConfig(host=args.host, port=args.port, insecure_http=True,
                                         limits=Limits(rate_per_min=1e6, max_concurrent=256)), keys, source,
                           report=figures.report if args.metrics_port else None)  # none: the boxes as before
    server.start()
    if not server.wait_started(20):
        say(error=f"gateway: {server.error}")
        return 2
    figures.serving = True
    metrics: BoxMetrics | None = None
    if args.metrics_port:
        metrics = BoxMetrics(settings, ctl, reader, figures, args.host, args.metrics_port, Path(args.metrics_token_file))
        if not metrics.start():
            say(error=f"/metrics: {metrics.error}")
            return 2
    ctl.add_answer_counter(server.app)  # a switch's drain waits for the answers this gateway streams
    t = ctl.start(args.profile)
    t.wait(180)
    snap = ctl.snapshot()
    say(ready=snap.is_ready, url=server.url, pid=os.getpid(), base_url=snap.base_url or "")
    lock = threading.Lock()
    try:
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            with lock:
                if cmd[0] == "switch":
                    task = ctl.switch(cmd[1])
                    task.wait(180)
                    s = ctl.snapshot()
                    say(switched=s.profile_id, ready=s.is_ready)
                elif cmd[0] in ("upgrade", "rollback"):
                    try:
                        say(**upgrade(settings, ctl, cmd[1] if cmd[0] == "upgrade" and len(cmd) > 1 else ""))
                    except (ValueError, OSError, LockBusy) as exc:  # what the CLI refuses on (app/cli/engine.py)
                        say(error=f"{' '.join(cmd)}: {type(exc).__name__}: {exc}")
                elif cmd[0] == "tokens":
                    keys.flush()
                    front = next((i.usage for i in keys.infos() if i.name == "front"), None)
                    base = ctl.snapshot().base_url or ""
                    say(tokens=engine_tokens(base), gateway=front.completion_tokens if front else 0,
                        prompt=engine_tokens(base, "vllm:prompt_tokens_total"),
                        gateway_prompt=front.prompt_tokens if front else 0)
                elif cmd[0] == "canary":  # its interval (0: off), so a test's engine counters are its requests' alone
                    ctl.set_canary_interval(float(cmd[1]))
                    say(canary=float(cmd[1]), sent=ctl.canary_counts()[0], in_flight=ctl.canary_in_flight.is_set())
                elif cmd[0] == "quit":
                    break
    finally:
        if metrics is not None:
            metrics.close()
        figures.serving = False
        server.stop()
        ctl.stop().wait(60)
        ctl.close()
        keys.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
