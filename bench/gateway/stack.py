"""What the gateway benches share (run.py, flood.py, fairness.py): a SIMULATED engine on a free loopback port, the
keys they need, and a standalone `moet-panel gateway` in front of it, in a temporary data dir; every process the
bench started is stopped when it ends, whatever happened."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.panelproc import free_port, stop_all

ROOT = Path(__file__).resolve().parents[2]
MODEL = "deepseek-v4-flash"


@dataclass
class Stack:
    engine: str  # http://127.0.0.1:PORT of the SIMULATED engine
    gateway: str  # http://127.0.0.1:PORT of the gateway
    gw_port: int
    keys: dict[str, str]
    tmp: Path
    env: dict[str, str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def gateway_proc(self) -> subprocess.Popen[bytes]:
        return self.procs[-1]


def bench_env(tok_s: float) -> dict[str, str]:
    # keep a PYTHONPATH the caller set (packages carried as wheels on another host), as download_bench does
    return {**os.environ, "MOET_SIM_DECODE_TOK_S": str(tok_s), "MOET_SIM_BOOT_S": "0", "MOET_SIM_REASONING_MODE": "none",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def wait_http(url: str, headers: dict[str, str] | None = None, timeout: float = 60.0, interval: float = 0.1) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            r = httpx.get(url, headers=headers, timeout=2)
            if r.status_code == 200:
                return
            last = f"{r.status_code} {r.text[:300]}"
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(interval)
    raise SystemExit(f"{url} did not answer 200 within {timeout:.0f} s (last: {last})")


@contextmanager
def gateway_stack(prefix: str, tok_s: float, slots: int, key_names: tuple[str, ...] = ("bench",),
                  gateway_args: tuple[str, ...] = ()) -> Iterator[Stack]:
    env = bench_env(tok_s)
    sim_port, gw_port = free_port(), free_port()
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        st = Stack(f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{gw_port}", gw_port, {}, Path(tmp), env)
        cli = [sys.executable, "-m", "app.cli.main", "--demo", "--data-dir", tmp]
        try:
            st.procs.append(subprocess.Popen([sys.executable, "-m", "app.backend.simengine", "--port", str(sim_port),
                                              "--served-model-name", MODEL, "--max-num-seqs", str(slots)], env=env,
                                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_http(st.engine + "/health")
            for name in key_names:
                out = subprocess.run([*cli, "keys", "create", name, "--json"], env=env, cwd=ROOT, check=True,
                                     capture_output=True, text=True).stdout
                st.keys[name] = json.loads(out)["key"]
            st.procs.append(subprocess.Popen([*cli, "gateway", "--port", str(gw_port), "--engine-url", st.engine,
                                              "--engine-slots", str(slots), "--rate", "1000000", *gateway_args],
                                             env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_http(st.gateway + "/v1/models", {"Authorization": f"Bearer {st.keys[key_names[0]]}"})
            yield st
        finally:
            stop_all(st.procs)
