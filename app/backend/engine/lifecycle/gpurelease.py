"""Wait until the GPU really released the old engine's memory (before the next boot of a switch).

Released = none of the old engine's pids is listed by NVML any more, and the memory in use minus what
other processes hold is below a threshold (the engine repo's runner waits for < 2048 MiB the same way).
"""

from __future__ import annotations

import threading
import time

from app.backend.engine.errlog import ENGINE_ERRORS
from app.backend.contracts import GpuReader, GpuSample


def wait_gpu_release(reader: GpuReader | None, old_pids: set[int], *, threshold: int, timeout_s: float,
                     poll_s: float, stop: threading.Event, skip: bool = False, gpu: int | None = None) -> bool:
    """True once released (or nothing to read); False at the deadline. `gpu`: only that GPU counts (a box of
    several: the other GPUs' engines keep their memory while this one switches; docs/engine.md "Several GPUs")."""
    if skip or reader is None or not reader.available:
        return True
    deadline = time.monotonic() + timeout_s
    while not stop.is_set():
        try:
            samples = reader.read()
        except Exception as exc:  # a flaky driver read counts as "not yet"
            ENGINE_ERRORS.caught("reading the GPU while waiting for its memory to be released", exc)
            samples = None
        if samples is not None and gpu is not None:
            samples = [s for s in samples if s.index == gpu]
        if samples is not None and all(_released(s, old_pids, threshold) for s in samples):
            return True
        if time.monotonic() > deadline:
            return False
        stop.wait(poll_s)
    return True


def _released(sample: GpuSample, old_pids: set[int], threshold: int) -> bool:
    procs = sample.processes
    if any(p.pid in old_pids for p in procs):
        return False
    others = sum(p.used_bytes or 0 for p in procs if p.pid not in old_pids)
    return sample.memory_used - others < threshold
