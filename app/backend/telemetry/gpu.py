"""Pick the GPU reader: real NVML when a driver is present, the SIMULATED card in demo mode,
otherwise a clear "no NVIDIA GPU" state (never an exception).

`MOET_PANEL_GPU=nvml|simulated|none` overrides the choice (e.g. `simulated` to make a demo on a
GPU box follow the simulated engine, `none` to keep the panel off NVML entirely).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from app.backend import oplog
from app.backend.contracts import EngineFeed, EngineSnapshot, GpuCountError, GpuReader, GpuSample, ReaderStatus
from app.backend.config import env
from app.backend.config.env import GpuMode
from app.backend.config.settings import Settings
from app.backend.config.simbox import sim_gpu_count
from app.backend.telemetry.gpu_sim import FakeGpuReader, SimulatedGpuReader
from app.backend.telemetry.nvml import NO_LIBRARY, NvmlGpuReader

class NoGpuReader(ReaderStatus):
    """The "no GPU" state: available False, a sentence saying why, no samples."""

    def __init__(self, error: str = NO_LIBRARY) -> None:
        self._error = error or NO_LIBRARY  # never "available"

    def read(self) -> list[GpuSample]:
        return []


def make_gpu_reader(
    settings: Settings | None,
    engine_snapshot_fn: Callable[[], EngineSnapshot] | None = None,
    engine_pids_fn: Callable[[], set[int]] | None = None,
    mode: GpuMode | None = None,
    nvml_reader: NvmlGpuReader | None = None,
) -> GpuReader:
    """Real NVML if available, else SIMULATED in demo mode, else NoGpuReader (see module doc).

    The engine functions feed only the SIMULATED card (its VRAM follows that engine; `follow_engine` gives it
    one later); a real reader returns raw samples and the telemetry hub marks the engine's processes.
    `nvml_reader`: the NVML reader this process already opened (serve's host probe) — reused, so the
    process opens NVML once; closed here when the choice is not NVML."""
    mode = mode or env.gpu_mode()
    demo = bool(settings and settings.demo)
    if mode in ("none", "simulated") and nvml_reader is not None:
        nvml_reader.close()
    if mode == "none":
        return NoGpuReader(f"GPU reading disabled ({env.GPU}=none)")
    if mode == "simulated":
        return _simulated(settings, engine_snapshot_fn, engine_pids_fn)
    real = nvml_reader if nvml_reader is not None else NvmlGpuReader()
    if real.available or mode == "nvml":
        return real
    if demo:
        return _simulated(settings, engine_snapshot_fn, engine_pids_fn)
    return NoGpuReader(real.error)


def follow_engine(reader: GpuReader, engine: EngineFeed, index: int = 0) -> SimulatedGpuReader | None:
    """Wire the app's one reader to the engine once the controller exists: the SIMULATED card (card `index` of
    a SIMULATED box of several) follows that engine's lifecycle (returned, so the telemetry hub can feed it the
    decode load); a real card needs nothing."""
    if not isinstance(reader, SimulatedGpuReader):
        return None
    reader.follow(engine, index)
    return reader


COUNT_DEADLINE_S = 20.0  # NVML at boot (driver still loading, persistence daemon starting) can be busy a while
COUNT_RETRY_S = 1.0


def box_gpu_count(reader: GpuReader, *, deadline_s: float = COUNT_DEADLINE_S, retry_s: float = COUNT_RETRY_S,
                  clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> int:
    """How many GPUs this box has for engines: the SIMULATED box's cards (MOET_PANEL_SIM_GPUS), else the GPUs
    the driver lists now; 1 on a box with no driver at all (the one engine the recipe always had).

    A driver that answers but cannot count or open its GPUs is asked again until `deadline_s`; past it,
    GpuCountError: an N-GPU box built as one GPU would leave the engines on GPUs 1..N-1 unsupervised, so the
    panel refuses to start instead (docs/engine.md "How many GPUs")."""
    if isinstance(reader, SimulatedGpuReader):
        return reader.count
    if isinstance(reader, NvmlGpuReader) and reader.count_error:
        return _recount(reader, deadline_s, retry_s, clock, sleep)
    if not reader.available:
        return 1
    end = clock() + deadline_s
    while True:
        try:
            return max(1, len(reader.read()))
        except Exception as exc:  # a flaky driver read at boot: asked again, then said loudly (raised)
            if clock() >= end:
                raise GpuCountError(_count_advice(f"{type(exc).__name__}: {exc}", deadline_s)) from exc
            oplog.caught("telemetry", exc, "counting the GPUs at start (asked again)")
        sleep(retry_s)


def _recount(reader: NvmlGpuReader, deadline_s: float, retry_s: float, clock: Callable[[], float],
             sleep: Callable[[float], None]) -> int:
    end = clock() + deadline_s
    oplog.decision("telemetry", "gpu_count_retry", who=oplog.PANEL, error=reader.count_error, deadline_s=deadline_s)
    while True:
        n = reader.recount()
        if not reader.count_error:
            oplog.decision("telemetry", "gpu_count", who=oplog.PANEL, gpus=n)
            return max(1, n)
        if clock() >= end:
            raise GpuCountError(_count_advice(reader.count_error, deadline_s))
        sleep(retry_s)


def _count_advice(error: str, deadline_s: float) -> str:
    return (f"cannot count this box's GPUs: NVML kept failing for {deadline_s:.0f} s ({error}). The panel does not "
            "start with a wrong number of GPUs (the engines on the GPUs it missed would run unsupervised). Check "
            "`nvidia-smi` lists every GPU, then start the panel again; under systemd it is restarted by itself.")


def tag_engine_processes(samples: list[GpuSample], pids: set[int], engine_name: str) -> list[GpuSample]:
    """Mark the GPU processes that belong to the engine (its container's pids) with the engine's name."""
    if not pids:
        return samples
    return [replace(g, processes=tuple(replace(p, container=p.container or engine_name or "engine") if p.pid in pids
                                       else p for p in g.processes)) for g in samples]


def _simulated(settings: Settings | None, snap_fn: Callable[[], EngineSnapshot] | None,
               pids_fn: Callable[[], set[int]] | None) -> SimulatedGpuReader:
    ready, total, boot = 93.8, 96.0, 4.0
    if settings is not None:
        ready, total = settings.recipe.vram.expected_gib, settings.recipe.vram.total_gib
        try:
            boot = float(settings.recipe.serve.env.get("MOET_SIM_BOOT_S", boot))
        except (TypeError, ValueError):
            pass
    return SimulatedGpuReader(snap_fn, total_gib=total, ready_gib=ready, boot_s=boot, engine_pids_fn=pids_fn,
                              count=sim_gpu_count(settings.state_dir if settings is not None else None))


__all__ = ["box_gpu_count", "follow_engine", "make_gpu_reader", "tag_engine_processes", "NoGpuReader", "NvmlGpuReader",
           "SimulatedGpuReader", "FakeGpuReader"]
