"""Sampler CPU cost: % of one core used by the TelemetrySampler sampling at 1 Hz (target ≤ 1%).

    python bench/sampler_cpu/run.py [--seconds 30] [--gpu nvml|simulated|none]

Runs, side by side in one process: (a) an idle baseline (the process doing nothing), (b) the hub
thread at 1 Hz — GPU reader (real NVML when present), psutil host sampler, trace parser drain,
alerts, timeline + SQLite history — and, when NVML is available, (c) a naive sampler that
re-initialises NVML and reads every field including PCIe throughput on every tick (the pattern
nvitop avoids: NVML init once, PCIe counters block ~20 ms each). CPU = process CPU time (all threads) ÷ wall time.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.backend.recipe import SIMULATED_RECIPE  # noqa: E402
from app.backend.config.settings import resolve_settings  # noqa: E402
from app.backend.telemetry.gpu import make_gpu_reader  # noqa: E402
from app.backend.telemetry.sampler import TelemetrySampler  # noqa: E402


def cpu_pct(fn, seconds: float) -> float:
    c0, w0 = time.process_time(), time.monotonic()
    fn(seconds)
    return 100.0 * (time.process_time() - c0) / (time.monotonic() - w0)


def idle(seconds: float) -> None:
    time.sleep(seconds)


def hub_run(settings, mode, interval: float):
    def run(seconds: float) -> None:
        hub = TelemetrySampler(settings, gpu_reader=make_gpu_reader(settings, mode=mode), interval_s=interval)
        hub.start()
        time.sleep(seconds)
        n = hub.latest().seq
        hub.close()
        run.ticks = n
    run.ticks = 0
    return run


def naive_run(interval: float):
    import pynvml

    def run(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pynvml.nvmlInit()
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                pynvml.nvmlDeviceGetName(h)
                pynvml.nvmlDeviceGetMemoryInfo(h)
                pynvml.nvmlDeviceGetUtilizationRates(h)
                pynvml.nvmlDeviceGetPowerUsage(h)
                pynvml.nvmlDeviceGetTemperature(h, 0)
                pynvml.nvmlDeviceGetEccMode(h)
                pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                pynvml.nvmlDeviceGetPcieThroughput(h, 0)
                pynvml.nvmlDeviceGetPcieThroughput(h, 1)
            pynvml.nvmlShutdown()
            time.sleep(interval)
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--gpu", choices=["nvml", "simulated", "none"], default=None, help="default: auto (NVML if present)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="moet-bench-") as tmp:
        settings = resolve_settings(SIMULATED_RECIPE, tmp, demo=True)
        probe = make_gpu_reader(settings, mode=args.gpu)
        reader_kind = type(probe).__name__ + (f" ({probe.error})" if not probe.available else "")
        real_nvml = type(probe).__name__ == "NvmlGpuReader" and probe.available
        closer = getattr(probe, "close", None)
        if closer:
            closer()
        print(f"GPU reader: {reader_kind}; {args.seconds:.0f} s per run at {1 / args.interval:.0f} Hz")
        base = cpu_pct(idle, args.seconds)
        print(f"idle baseline                      {base:6.3f} % of one core")
        run = hub_run(settings, args.gpu, args.interval)
        hub = cpu_pct(run, args.seconds)
        print(f"TelemetrySampler sampler               {hub:6.3f} % of one core ({run.ticks} ticks); "
              f"net of baseline {hub - base:6.3f} %  target ≤ 1%: {'MET' if hub - base <= 1.0 else 'NOT MET'}")
        if real_nvml:
            nv = cpu_pct(naive_run(args.interval), args.seconds)
            print(f"naive NVML sampler (re-init + PCIe every tick) {nv:6.3f} % — hub is ×{nv / max(hub, 1e-6):.1f} cheaper")
    return 0


if __name__ == "__main__":
    sys.exit(main())
