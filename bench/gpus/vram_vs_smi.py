"""The panel's GPU reading beside nvidia-smi's, on a real card (issue 43 item 6, docs/engine.md "VRAM as
nvidia-smi shows it"): idle, then (with --load) while a CUDA process holds memory and computes. Prints, per GPU,
the panel's "used" (what the header, the per-GPU plots and the VRAM > 98 % alert use) and its driver reserve
apart, next to nvidia-smi's memory.used, plus utilisation, power and temperature side by side.

    .venv/bin/python bench/gpus/vram_vs_smi.py [--load] [--samples 5]

--load needs torch with CUDA in the same interpreter (the device machines carry it as a wheel); without it the
idle rows are printed and the load rows say why they are missing. Needs the NVIDIA driver (nvidia-smi, NVML).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.backend.contracts import GpuSample  # noqa: E402
from app.backend.telemetry.nvml import NvmlGpuReader  # noqa: E402

MiB = 2**20
SMI = ["nvidia-smi", "--query-gpu=index,memory.used,memory.total,utilization.gpu,power.draw,temperature.gpu",
       "--format=csv,noheader,nounits"]


def smi() -> dict[int, list[str]]:
    out = subprocess.run(SMI, capture_output=True, text=True, timeout=30, check=True).stdout
    rows = [[x.strip() for x in line.split(",")] for line in out.strip().splitlines()]
    return {int(r[0]): r[1:] for r in rows}


def compare(label: str, reader: NvmlGpuReader, samples: int) -> None:
    for _ in range(samples):
        ours: list[GpuSample] = reader.read()
        theirs = smi()
        for g in ours:
            s = theirs.get(g.index, ["?"] * 5)
            used = g.memory_in_use / MiB
            print(f"{label:5} GPU {g.index}: panel used {used:8.0f} MiB (+ reserve {g.memory_reserved / MiB:5.0f}) "
                  f"| smi used {s[0]:>8} MiB | diff {used - float(s[0]) if s[0] != '?' else float('nan'):+6.0f} | "
                  f"util {g.util_gpu} vs {s[2]} | power {g.power_w} vs {s[3]} | temp {g.temperature_c} vs {s[4]}")
        time.sleep(1.0)


def load(stop: threading.Event) -> tuple[str, threading.Thread | None]:
    """Hold ~8 GiB and keep the SMs busy until `stop`: ('', the thread) when running, else (why not, None).
    The caller joins the thread: a daemon thread still in a CUDA call at exit aborts the interpreter."""
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return "torch is not installed here", None
    if not torch.cuda.is_available():
        return "torch sees no CUDA device", None

    def run() -> None:
        hold = torch.empty(8 * 2**30, dtype=torch.uint8, device="cuda")
        a = torch.randn(8192, 8192, device="cuda")
        while not stop.is_set():
            a = a @ a
            a = a / a.norm()
            torch.cuda.synchronize()
        del hold

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    time.sleep(5.0)  # the allocation and the first kernels land
    return "", worker


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--load", action="store_true", help="compare under load too (needs torch with CUDA)")
    ap.add_argument("--samples", type=int, default=5)
    args = ap.parse_args()
    reader = NvmlGpuReader()
    if not reader.available:
        print(f"no NVML: {reader.error}", file=sys.stderr)
        return 1
    try:
        compare("idle", reader, args.samples)
        if args.load:
            stop = threading.Event()
            why, worker = load(stop)
            if why:
                print(f"load: not measured ({why})")
            else:
                compare("load", reader, args.samples)
            stop.set()
            if worker is not None:
                worker.join(timeout=60.0)
    finally:
        reader.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
