"""How long a click on Stop takes to answer while the panel's observer is blocked on a slow Docker (issue 39,
done-when: "a click on Stop answers within 200 ms while the observer is blocked on a slow Docker").

    .venv/bin/python -m bench.chaos.click_latency [--delay 10] [--runs 3] [--resync-s 0.5]

Each run: a supervising EngineController reaching Docker through the chaos proxy (bench/chaos/docker_proxy.py,
as DOCKER_HOST) starts the SIMULATED engine and waits for ready; then the proxy holds every Docker reply
`--delay` s, the run waits until a reply to the controller is held (its resync or event pump is blocked on
Docker), and clicks Stop (`EngineController.stop()`, what the Engine tab's button calls). Prints the time
`stop()` took to hand back its ticket and whether a Docker reply was delivered meanwhile (if one was, the
click waited for Docker). Goal: ≤ 200 ms. tests/engine/test_click_slow_docker.py asserts the behaviour (the
ticket comes back while the reply is still held), this prints the figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.chaos.docker_proxy import DockerProxy
from bench.panelproc import free_port


@dataclass
class Rig:
    proxy: DockerProxy
    ctl: object  # EngineController (typed loosely: bench code, the controller's module may move)


@contextmanager
def slow_docker_rig(home: Path, resync_s: float = 0.5) -> Iterator[Rig]:
    """A ready SIMULATED engine under a supervising controller whose Docker is the proxy at `home`/docker.sock.
    Everything of its recipe id is removed at the end, the proxy stopped, `home` deleted."""
    import docker

    from app.backend.engine.controller import ControllerOptions, EngineController
    from app.backend.engine.runtime.docker import DockerRuntime
    from app.backend.recipe import SIMULATED_RECIPE, load_recipe
    from app.backend.config.settings import Settings
    from app.backend.simengine.image import content_tag, ensure_image

    real = docker.from_env(timeout=30)
    image = ensure_image(real, tag=content_tag())
    port = free_port()
    r = load_recipe(SIMULATED_RECIPE)
    args = list(r.serve.args)
    args[args.index("--port") + 1] = str(port)
    r = r.model_copy(update={
        "id": f"chaos-click-{port}", "serve": r.serve.model_copy(update={"port": port, "args": args}),
        "engine": r.engine.model_copy(update={"boot_timeout_s": 60, "stop_grace_s": 5, "image": image}),
    })
    settings = Settings(SIMULATED_RECIPE, r, home / "data", True)
    proxy = DockerProxy(home / "docker.sock").start()
    saved = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = proxy.url  # app/backend/config/env.py reads it when the runtime makes its client
    ctl = None
    try:
        opts = ControllerOptions(extra_env={"MOET_SIM_BOOT_S": "1"}, extra_labels={"moet-panel.test": "1"},
                                 supervise=True, resync_s=resync_s)
        ctl = EngineController(settings, DockerRuntime(), options=opts)
        t = ctl.start("quality")
        if not (t.accepted and t.wait(90) and t.ok):
            raise RuntimeError(f"the engine did not start: {t.message} {ctl.snapshot().message}")
        yield Rig(proxy, ctl)
    finally:
        proxy.set_delay(0)
        if ctl is not None:
            ctl.close()
        proxy.stop()
        if saved is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = saved
        for c in real.containers.list(all=True, filters={"label": f"moet-panel.recipe={r.id}"}):
            c.remove(force=True)
        shutil.rmtree(home, ignore_errors=True)


def wait_held(proxy: DockerProxy, timeout: float = 15.0) -> bool:
    """Until a Docker reply to the controller is held by the proxy (the observer is blocked on Docker)."""
    deadline = time.monotonic() + timeout
    while proxy.held() < 1:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    ap.add_argument("--delay", type=float, default=10.0, help="seconds every Docker reply is held")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--resync-s", type=float, default=0.5, help="the controller's full re-read interval")
    args = ap.parse_args()
    took: list[float] = []
    for i in range(args.runs):
        home = Path.home() / f"moet-chaos-click-{os.getpid()}-{i}"
        with slow_docker_rig(home, args.resync_s) as rig:
            rig.proxy.set_delay(args.delay)
            if not wait_held(rig.proxy):
                print(f"run {i + 1}: no Docker call of the controller within 15 s; nothing measured")
                continue
            before = rig.proxy.delivered_total
            t0 = time.perf_counter()
            ticket = rig.ctl.stop()  # type: ignore[attr-defined]
            ms = (time.perf_counter() - t0) * 1000
            waited = rig.proxy.delivered_total != before
            took.append(ms)
            rig.proxy.set_delay(0)
            ticket.wait(60)  # the stop finishes before the rig is taken down (nothing writes into a removed dir)
            print(f"run {i + 1}: stop() answered in {ms:.0f} ms (accepted={ticket.accepted}; "
                  f"{'a Docker reply arrived meanwhile: the click waited for Docker' if waited else 'no Docker reply arrived meanwhile'})",
                  flush=True)
    if took:
        print(f"click on Stop with every Docker reply held {args.delay:g} s: median {statistics.median(took):.0f} ms, "
              f"max {max(took):.0f} ms over {len(took)} runs (goal <= 200 ms)")
    return 0 if took and max(took) <= 200 else 1


if __name__ == "__main__":
    raise SystemExit(main())
