"""GPU reading types shared by telemetry (sampler) and engine control (preflight, memory release)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_bytes: int | None
    name: str = ""
    container: str = ""  # engine container name when the pid belongs to it


@dataclass(frozen=True)
class GpuSample:
    index: int
    uuid: str
    name: str
    compute_capability: tuple[int, int] | None
    memory_total: int
    memory_used: int  # v2 "used" (excludes driver-reserved)
    memory_reserved: int
    util_gpu: float | None = None
    util_mem: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: float | None = None
    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    throttle_reasons: tuple[str, ...] = ()
    pcie_tx_kbs: float | None = None
    pcie_rx_kbs: float | None = None
    ecc_current: bool | None = None
    ecc_pending: bool | None = None
    processes: tuple[GpuProcess, ...] = ()
    ts: float = 0.0
    simulated: bool = False  # from the demo-mode SIMULATED reader, never a real card

    @property
    def memory_in_use(self) -> int:
        """What nvidia-smi calls used (v1): v2 used + driver-reserved."""
        return self.memory_used + self.memory_reserved


class GpuReader(Protocol):
    """Anything that can read the GPUs now (real NVML or the CI fake)."""

    @property
    def available(self) -> bool: ...

    @property
    def error(self) -> str:
        """Why no GPU can be read ("no NVIDIA GPU: libnvidia-ml.so not found"), '' when available."""
        ...

    def read(self) -> list[GpuSample]: ...


class ReaderStatus:
    """`available` / `error` / `simulated` derived from one `_error` sentence (shared by the readers)."""

    _error: str = ""
    _simulated: bool = False

    @property
    def available(self) -> bool:
        return not self._error

    @property
    def error(self) -> str:
        return self._error

    @property
    def simulated(self) -> bool:
        return self._simulated
