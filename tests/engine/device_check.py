"""Manual check on a real GPU box (not collected by pytest): the engine's GPU-dependent paths over real NVML.

    python tests/engine/device_check.py

1. the panel's NVML reader: name, compute capability, memory, ECC, processes;
2. preflight's GPU items for the real recipe (GPU model / ECC / memory in use);
3. the switch's memory-release wait: a child process allocates GPU memory through libcuda, is killed,
   and the controller's wait must see the memory come back (with its pid gone from NVML's process list).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ALLOC_GIB = 20
CHILD = f"""
import ctypes, sys, time
cu = ctypes.CDLL("libcuda.so.1")
assert cu.cuInit(0) == 0
dev = ctypes.c_int(); assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx = ctypes.c_void_p(); assert cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
ptr = ctypes.c_uint64(); rc = cu.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t({ALLOC_GIB} << 30))
print("alloc rc", rc, flush=True)
time.sleep(600)
"""


def main() -> int:
    from app.backend.engine.controller import ControllerOptions, EngineController
    from app.backend.engine.lifecycle.preflight import PreflightInputs, run_preflight
    from app.backend.recipe import DEFAULT_RECIPE, load_recipe
    from app.backend.config.settings import Settings
    from app.backend.telemetry.nvml import NvmlGpuReader

    reader = NvmlGpuReader()
    print("reader available:", reader.available, reader.error)
    t0 = time.perf_counter()
    samples = reader.read()
    print(f"read() took {1000 * (time.perf_counter() - t0):.1f} ms")
    for s in samples:
        print(f"GPU{s.index}: {s.name} cc={s.compute_capability} total={s.memory_total / 2**30:.1f} GiB "
              f"used={s.memory_used / 2**30:.2f} GiB ecc={s.ecc_current} pending={s.ecc_pending} procs={s.processes}")
    recipe = load_recipe(DEFAULT_RECIPE)
    inp = PreflightInputs(recipe=recipe, env=dict(recipe.serve.env), data_dir=Path("/tmp/moet-devcheck"), runtime=None,
                          runtime_error="(no Docker on this check)", gpu_reader=reader)
    for item in run_preflight(inp).items:
        if item.id in ("gpu", "ecc", "gpu_memory", "host_ram", "disk"):
            print(f"preflight {item.id}: {item.status} — {item.detail}" + (f" | fix: {item.fix}" if item.fix else ""))

    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    print("child:", child.stdout.readline().strip(), "pid", child.pid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        s = reader.read()[0]
        if s.memory_used > (ALLOC_GIB - 1) << 30:
            break
        time.sleep(0.1)
    s = reader.read()[0]
    print(f"with child: used={s.memory_used / 2**30:.2f} GiB, processes={[(p.pid, p.used_bytes) for p in s.processes]}")
    settings = Settings(DEFAULT_RECIPE, recipe, Path("/tmp/moet-devcheck"), False)
    ctl = EngineController(settings, None, gpu_reader=reader,
                           options=ControllerOptions(reattach=False, gpu_release_timeout_s=60, poll_interval_s=0.05))
    t_busy = time.perf_counter()
    short = EngineController(settings, None, gpu_reader=reader,
                             options=ControllerOptions(reattach=False, gpu_release_timeout_s=1.0, poll_interval_s=0.05))
    print("release wait while the child holds memory (1 s deadline) ->", short._boot.wait_gpu_release({child.pid}),
          f"after {time.perf_counter() - t_busy:.2f} s")
    child.kill()
    t_kill = time.perf_counter()
    ok = ctl._boot.wait_gpu_release({child.pid})
    print(f"release wait after SIGKILL -> {ok} after {time.perf_counter() - t_kill:.2f} s")
    s = reader.read()[0]
    print(f"after: used={s.memory_used / 2**30:.2f} GiB, processes={[(p.pid, p.used_bytes) for p in s.processes]}")
    child.wait()
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("MOET_PANEL_GPU", "nvml")
    sys.exit(main())
