#!/usr/bin/env python3
"""A click never waits behind a Docker call (issue 39): how long Start/Stop/Switch take to ANSWER while Docker is
slow.

    .venv/bin/python bench/click_latency.py [--delay-s 10] [--clicks 5]

A unix-socket proxy in front of the real Docker socket (DOCKER_HOST for the panel's runtime) delays every reply
by --delay-s once it is switched on. The panel's controller (SIMULATED image, real Docker, its own recipe id and
port) starts the engine with the proxy open, then the proxy turns slow and the bench waits until the observer
is inside a delayed Docker call. Then it clicks: a Switch and a Start refused at once (a stop is running / the
engine is live) and one Stop, timing each call until it returns its ticket. Prints each click's answer time
(goal: < 200 ms) and how long the slow Docker call that was in flight took. The containers are removed at the
end (through the real socket).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import docker  # noqa: E402

from app.backend.engine.controller import ControllerOptions, EngineController  # noqa: E402
from app.backend.engine.runtime.docker import DockerRuntime  # noqa: E402
from app.backend.recipe import SIMULATED_RECIPE  # noqa: E402
from app.backend.config.settings import Settings  # noqa: E402
from app.backend.simengine.image import ensure_image  # noqa: E402
from tests.engine.conftest import TEST_LABEL, free_port, sim_recipe  # noqa: E402

REAL = "/var/run/docker.sock"


class SlowProxy:
    """Forwards a unix socket to the Docker socket; while `delay_s` > 0 every chunk Docker sends back waits that
    long first (a daemon busy with an upgrade, a stuck storage driver)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.delay_s = 0.0
        self.in_delay = threading.Event()  # a reply is being held now
        path.unlink(missing_ok=True)
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(str(path))
        self._srv.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            up.connect(REAL)
            threading.Thread(target=self._pipe, args=(client, up, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(up, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        try:
            while data := src.recv(65536):
                if slow and self.delay_s > 0:
                    self.in_delay.set()
                    time.sleep(self.delay_s)  # the fault this bench injects
                    self.in_delay.clear()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._srv.close()
        self.path.unlink(missing_ok=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--delay-s", type=float, default=10.0)
    ap.add_argument("--clicks", type=int, default=5, help="refused clicks (start, switch) timed while Docker is slow")
    args = ap.parse_args()
    real = docker.from_env(timeout=60)
    ensure_image(real)
    home = Path.home() / f"moet-test-click-{os.getpid()}"
    home.mkdir(parents=True, exist_ok=True)
    proxy = SlowProxy(home / "docker.sock")
    recipe = sim_recipe(free_port())
    st = Settings(SIMULATED_RECIPE, recipe, home / "data", True)
    st.ensure_state_dir()
    client = docker.DockerClient(base_url=f"unix://{proxy.path}", timeout=60)
    opts = ControllerOptions(extra_env={"MOET_SIM_BOOT_S": "1"}, extra_labels=dict(TEST_LABEL), resync_s=0.5)
    ctl = EngineController(st, DockerRuntime(client), options=opts)
    try:
        t = ctl.start("quality")
        if not (t.wait(120) and t.ok):
            print(f"start failed: {t.message}")
            return 1
        proxy.delay_s = args.delay_s
        if not proxy.in_delay.wait(10):
            print("the observer never reached Docker through the proxy")
            return 1
        slow_since = time.monotonic()
        answers: list[float] = []
        for _ in range(args.clicks):
            t0 = time.perf_counter()
            ctl.start("quality")  # refused: live
            answers.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        stop = ctl.stop()
        stop_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ctl.switch("balanced")  # refused: the stop runs
        switch_s = time.perf_counter() - t0
        blocked = proxy.in_delay.is_set()
        print(f"Docker replies delayed by {args.delay_s:g} s; observer inside a delayed call: {blocked}")
        print(f"Stop click answered in {stop_s * 1000:.1f} ms (accepted: {stop.accepted}) — goal < 200 ms")
        print(f"Switch click (refused: a stop runs) answered in {switch_s * 1000:.1f} ms")
        print(f"Start clicks (refused: live) x{len(answers)}: median {statistics.median(answers) * 1000:.1f} ms, "
              f"max {max(answers) * 1000:.1f} ms")
        print(f"all clicks done {time.monotonic() - slow_since:.2f} s into the slow Docker")
        proxy.delay_s = 0.0
        stop.wait(300)
        print(f"the stop itself finished: {stop.message}")
        return 0
    finally:
        proxy.delay_s = 0.0
        ctl.close()
        for c in real.containers.list(all=True, filters={"label": f"moet-panel.recipe={recipe.id}"}):
            c.remove(force=True)
        proxy.close()
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
