"""Run `moet-panel serve` with a CPU-weighted stack sampler (no py-spy here): every 50 ms, each thread
whose CPU time (/proc/self/task/<tid>/stat) grew is charged that CPU at its current Python stack. On
SIGTERM the top stacks are written to the file named by argv[1] (bench/idle_cpu.py reads it)."""

from __future__ import annotations

import collections
import json
import os
import signal
import sys
import threading
from pathlib import Path

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def _cpu_ticks(tid: int) -> int:
    try:
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15 of stat)


def _stack_key(frame: object, depth: int = 6) -> str:
    parts = []
    f = frame
    while f is not None and len(parts) < depth:
        code = f.f_code  # type: ignore[attr-defined]
        name = code.co_filename
        if "/app/" in name or "/gradio/" in name or "/uvicorn/" in name or "/starlette/" in name or "site-packages" in name:
            short = name.split("/app/", 1)[-1] if "/app/" in name else name.rsplit("site-packages/", 1)[-1]
            parts.append(f"{short}:{code.co_name}")
        f = f.f_back  # type: ignore[attr-defined]
    return " < ".join(parts) or "(stdlib only)"


def main() -> None:
    out = Path(sys.argv[1])
    argv = sys.argv[2:]
    charged: collections.Counter[str] = collections.Counter()
    last: dict[int, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            frames = sys._current_frames()
            for t in threading.enumerate():
                tid = t.native_id
                if tid is None or t is threading.current_thread():
                    continue
                now = _cpu_ticks(tid)
                grew = now - last.get(tid, now)
                last[tid] = now
                if grew > 0 and t.ident in frames:
                    charged[f"[{t.name}] " + _stack_key(frames[t.ident])] += grew

    sampler = threading.Thread(target=sample, name="bench-sampler", daemon=True)

    def dump(*_: object) -> None:
        total = sum(charged.values()) or 1
        top = [{"cpu_s": round(n * TICK_S, 2), "share": round(n / total, 3), "stack": k} for k, n in charged.most_common(40)]
        # the sampler's own thread id: the bench leaves its CPU out of the panel's figure
        out.write_text(json.dumps({"sampler_tid": sampler.native_id, "stacks": top}, indent=1))

    sampler.start()
    signal.signal(signal.SIGUSR1, dump)  # a snapshot of the stacks so far, while the panel keeps running
    from app.cli.main import main as cli

    try:
        sys.exit(cli(argv))
    finally:
        stop.set()
        dump()


if __name__ == "__main__":
    main()
