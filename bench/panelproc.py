"""What the panel benchmarks share (bench/idle_cpu.py, bench/ui_push.py, bench/gateway/run.py): a demo panel
run as its own `moet-panel serve` process group, on a copy of the SIMULATED recipe with its own id and free
ports, so nothing of another panel or test on the box is touched."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def recipe_copy(root: Path, tmp: Path, rid: str, boot_s: str | None = None) -> tuple[Path, str]:
    """`root`'s SIMULATED recipe as `tmp/recipe.toml`, with id `rid` and a free engine port; `boot_s`
    replaces the simulated boot time. Returns (path, rid)."""
    text = (root / "assets" / "recipes" / "simulated.toml").read_text()
    port = free_port()
    text = text.replace('id = "simulated"', f'id = "{rid}"', 1).replace("port = 8000", f"port = {port}")
    text = text.replace('"--port", "8000"', f'"--port", "{port}"')
    if boot_s is not None:
        text = text.replace('MOET_SIM_BOOT_S = "4"', f'MOET_SIM_BOOT_S = "{boot_s}"')
    path = tmp / "recipe.toml"
    path.write_text(text)
    return path, rid


def panel_env(root: Path, tmp: Path) -> dict[str, str]:
    """This environment without the panel's and Gradio's own settings, data under `tmp`, `root`'s code."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOET_PANEL_", "GRADIO_"))}
    env.update(XDG_DATA_HOME=str(tmp / "share"), PYTHONPATH=str(root))
    return env


def wait_running(proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 120.0) -> None:
    """Until the panel writing `log` says it is running; exits the bench with the log's tail if it died."""
    deadline = time.monotonic() + timeout_s
    while "moet-panel is running" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the panel did not start:\n" + log.read_text()[-3000:])
        time.sleep(0.2)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the panel's process group (started with start_new_session), SIGKILL after 30 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def stop_all(procs: list[subprocess.Popen[bytes]], timeout_s: float = 10.0) -> None:
    """Terminate the processes a bench started (only those), then kill what is still there after `timeout_s`."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()


class DemoPanel:
    """`moet-panel serve --demo` of `root`'s code on `recipe` (a `recipe_copy`), in its own process group on a free
    port with its data under `tmp`; `cli()` runs a subcommand on the same data; `close()` stops the engine it
    may have started, removes that recipe's containers, then stops the panel's group. `argv` replaces the
    command before `serve` (bench/idle_cpu.py runs it under its stack probe)."""

    def __init__(self, root: Path, tmp: Path, recipe: Path, argv: tuple[str, ...] = ()) -> None:
        import sys

        self.root, self.tmp, self.recipe = root, tmp, recipe
        self.port = free_port()
        self.env = panel_env(root, tmp)
        self.logpath = tmp / "panel.log"
        self.log = open(self.logpath, "w")
        head = list(argv) or [sys.executable, "-m", "app.cli.main"]
        self.proc = subprocess.Popen([*head, "serve", "--demo", "--recipe", str(recipe), "--port", str(self.port)],
                                     cwd=root, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        wait_running(self.proc, self.logpath)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def cli(self, *args: str) -> None:
        import sys

        subprocess.run([sys.executable, "-m", "app.cli.main", *args, "--demo", "--recipe", str(self.recipe)],
                       cwd=self.root, env=self.env, check=True, stdout=subprocess.DEVNULL, timeout=300)

    def close(self, rid: str | None = None) -> None:
        """With `rid` (the recipe copy's id): stop its engine and remove its containers first."""
        if rid is not None:
            import sys

            try:
                self.cli("engine", "stop")
            except Exception as exc:  # still remove the container below
                print(f"engine stop: {exc}", file=sys.stderr)
        stop_group(self.proc)
        self.log.close()
        if rid is not None:
            import docker

            for c in docker.from_env().containers.list(all=True, filters={"label": f"moet-panel.recipe={rid}"}):
                c.remove(force=True)
