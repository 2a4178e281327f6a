"""Pick the GPU reader: real NVML when a driver is present, the SIMULATED card in demo mode,
otherwise a clear "no NVIDIA GPU" state (never an exception).

`MOET_PANEL_GPU=nvml|simulated|none` overrides the choice (e.g. `simulated` to make a demo on a
GPU box follow the simulated engine, `none` to keep the panel off NVML entirely).
"""

from __future__ import annotations

from typing import Callable

from app.backend.contracts import EngineFeed, EngineSnapshot, GpuReader, GpuSample, ReaderStatus
from app.backend import env
from app.backend.env import GpuMode
from app.backend.settings import Settings
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
    name_fn = _engine_name_fn(engine_snapshot_fn)
    if nvml_reader is not None:
        real = nvml_reader
        real.engine_pids_fn, real.engine_name_fn = engine_pids_fn, name_fn
    else:
        real = NvmlGpuReader(engine_pids_fn=engine_pids_fn, engine_name_fn=name_fn)
    if real.available or mode == "nvml":
        return real
    if demo:
        return _simulated(settings, engine_snapshot_fn, engine_pids_fn)
    return NoGpuReader(real.error)


def engine_gpu_reader(settings: Settings, controller_ref: list[EngineFeed],
                      nvml_reader: NvmlGpuReader | None = None) -> GpuReader:
    """The app's one GPU reader, shared by the engine controller and telemetry; `nvml_reader` is the NVML reader
    the host probe already opened (reused). `controller_ref` gets the controller once it is made."""

    def snap() -> EngineSnapshot:  # late-bound: the controller does not exist yet while the reader is made
        return controller_ref[0].snapshot() if controller_ref else EngineSnapshot()

    def pids() -> set[int]:
        return controller_ref[0].container_pids() if controller_ref else set()

    return make_gpu_reader(settings, engine_snapshot_fn=snap, engine_pids_fn=pids, nvml_reader=nvml_reader)


def _simulated(settings: Settings | None, snap_fn: Callable[[], EngineSnapshot] | None,
               pids_fn: Callable[[], set[int]] | None) -> SimulatedGpuReader:
    ready, total, boot = 93.8, 96.0, 4.0
    if settings is not None:
        ready, total = settings.recipe.vram.expected_gib, settings.recipe.vram.total_gib
        try:
            boot = float(settings.recipe.serve.env.get("MOET_SIM_BOOT_S", boot))
        except (TypeError, ValueError):
            pass
    reader = SimulatedGpuReader(snap_fn, total_gib=total, ready_gib=ready, boot_s=boot)
    reader.engine_pids_fn = pids_fn
    return reader


def _engine_name_fn(snap_fn: Callable[[], EngineSnapshot] | None) -> Callable[[], str] | None:
    if snap_fn is None:
        return None
    return lambda: snap_fn().container_name or "engine"


__all__ = ["engine_gpu_reader", "make_gpu_reader", "NoGpuReader", "NvmlGpuReader", "SimulatedGpuReader", "FakeGpuReader"]
