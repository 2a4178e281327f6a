"""Real GPU reader over NVML (nvidia-ml-py, `import pynvml`), sampled the way nvitop does it.

* `nvmlInit` once; handles cached; every call wrapped so an NVML error becomes None ("N/A"),
  and a function the driver lacks (NVML_ERROR_NOT_SUPPORTED) is remembered and not retried.
* Fast set every `read()`: memory v2 (used + reserved apart), utilisation, power + limit,
  temperature, SM/memory clocks, throttle reasons, compute processes.
* PCIe TX/RX block ~20 ms per counter (measured on the H200 host; docs/telemetry.md), so they refresh
  on their own slower cadence; ECC mode is behind a TTL cache. Both are read only from the sampler thread.

`import pynvml` needs no driver (the library is loaded by `nvmlInit`), so its constants and exception
classes are used directly; the calls go through `self._nv` so tests can hand in a fake module.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pynvml

from app.backend import oplog
from app.backend.contracts import GpuProcess, GpuSample, ReaderStatus

# Clocks-event ("throttle") reason bits → short names.
THROTTLE_BITS: tuple[tuple[int, str], ...] = (
    (pynvml.nvmlClocksEventReasonGpuIdle, "gpu_idle"),
    (pynvml.nvmlClocksEventReasonApplicationsClocksSetting, "applications_clocks"),
    (pynvml.nvmlClocksEventReasonSwPowerCap, "sw_power_cap"),
    (pynvml.nvmlClocksEventReasonHwSlowdown, "hw_slowdown"),
    (pynvml.nvmlClocksEventReasonSyncBoost, "sync_boost"),
    (pynvml.nvmlClocksEventReasonSwThermalSlowdown, "sw_thermal"),
    (pynvml.nvmlClocksEventReasonHwThermalSlowdown, "hw_thermal"),
    (pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown, "hw_power_brake"),
    (pynvml.nvmlClocksEventReasonDisplayClockSetting, "display_clocks"),
)
# Errors that mean "this driver will never answer this call": remembered, not retried.
UNSUPPORTED = (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported)
NO_LIBRARY = "no NVIDIA GPU (libnvidia-ml.so not found)"


def decode_throttle(mask: int | None) -> tuple[str, ...]:
    """Bitmask → names; `gpu_idle` alone is normal and kept (the UI shows it dimmed)."""
    if not mask:
        return ()
    return tuple(name for bit, name in THROTTLE_BITS if mask & bit)


@dataclass(frozen=True)
class _Static:
    """What a device says once: its identity."""

    uuid: str
    name: str
    cc: tuple[int, int] | None


class NvmlGpuReader(ReaderStatus):
    """GpuReader over the real driver. Construct once; `read()` from one (sampler) thread."""

    def __init__(
        self,
        pcie_interval_s: float = 5.0,
        ecc_ttl_s: float = 30.0,
        nvml: ModuleType | None = None,  # a stand-in for the pynvml module (tests)
    ) -> None:
        self._pcie_interval = pcie_interval_s
        self._ecc_ttl = ecc_ttl_s
        self._lock = threading.Lock()
        self._missing: set[str] = set()  # functions the driver lacks (not retried)
        self._errors = oplog.Once("telemetry")  # a lost GPU fails every read: logged once per call
        self._handles: list[object] = []  # pynvml's opaque device handles
        self._static: list[_Static] = []
        self._pcie: dict[int, tuple[float, float | None, float | None]] = {}
        self._ecc: dict[int, tuple[float, bool | None, bool | None]] = {}
        self._proc_names: dict[int, str] = {}
        self._error = ""
        self._count_error = ""
        self._nv = nvml
        self._init()

    # -- GpuReader protocol -------------------------------------------------------------------
    def read(self) -> list[GpuSample]:
        if self._error:
            return []
        with self._lock:
            now = time.time()
            return [self._sample(i, h, now) for i, h in enumerate(self._handles)]

    def close(self) -> None:
        if not self._error and self._nv is not None:
            self._q("nvmlShutdown")
            self._error = "NVML shut down"

    # -- internals ----------------------------------------------------------------------------
    def _init(self) -> None:
        if self._nv is None:
            self._nv = pynvml
        try:
            self._nv.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ... (handed on: `error`)
            self._error = _init_error(exc)
            return
        self._open_devices()

    def _open_devices(self) -> None:
        """Count the GPUs and open every one. A count or a handle NVML could not give is no GPU fewer: it is
        kept in `count_error` (and `error`), and `box_gpu_count()` retries it, then refuses to start on a wrong
        count (docs/engine.md "How many GPUs")."""
        nv = self._nv or pynvml
        try:
            count = int(nv.nvmlDeviceGetCount())
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:  # NVML busy at boot, a GPU fallen off the bus (handed on: `count_error`)
            self._count_error = f"{type(exc).__name__}: {exc}"
            self._error = f"NVML could not count or open this box's GPUs ({self._count_error})"
            return
        self._count_error = ""
        self._handles, self._static = [], []
        for h in handles:
            self._handles.append(h)
            cc = self._q("nvmlDeviceGetCudaComputeCapability", h)
            self._static.append(_Static(str(self._q("nvmlDeviceGetUUID", h) or ""),
                                        str(self._q("nvmlDeviceGetName", h) or "NVIDIA GPU"),
                                        (int(cc[0]), int(cc[1])) if cc else None))
        self._error = "" if self._handles else "no NVIDIA GPU (the driver reports 0 devices)"

    @property
    def count_error(self) -> str:
        """Why NVML could not count or open every GPU ('' when it could): a transient state at boot."""
        return self._count_error

    def recount(self) -> int:
        """Ask NVML again for the GPUs (after a `count_error`); the number opened. Raises nothing: a failure
        stays in `count_error`."""
        with self._lock:
            if self._count_error:
                self._open_devices()
            return len(self._handles)

    def _q(self, fn: str, *args: object, key: str = "") -> Any:  # pynvml is untyped: its answers are Any
        """Call pynvml.<fn>; any NVML error → None (N/A); an unsupported call is remembered under `key`."""
        key = key or fn
        if key in self._missing:
            return None
        try:
            return getattr(self._nv, fn)(*args)
        except (AttributeError, *UNSUPPORTED):
            self._missing.add(key)
            return None
        except Exception as exc:  # any other NVML error (GPU lost, timeout, ...): N/A now, asked again next time
            self._errors.caught(exc, f"NVML {key}")
            return None

    def _memory(self, h: object) -> tuple[int, int, int]:
        mem = self._q("nvmlDeviceGetMemoryInfo", h, pynvml.nvmlMemory_v2, key="memory_v2")
        if mem is not None and hasattr(mem, "reserved"):
            return int(mem.total), int(mem.used), int(mem.reserved)
        mem = self._q("nvmlDeviceGetMemoryInfo", h)
        if mem is None:
            return 0, 0, 0
        return int(mem.total), int(mem.used), 0

    def _sample(self, i: int, h: object, now: float) -> GpuSample:
        total, used, reserved = self._memory(h)
        util = self._q("nvmlDeviceGetUtilizationRates", h)
        power = self._q("nvmlDeviceGetPowerUsage", h)
        limit = self._q("nvmlDeviceGetEnforcedPowerLimit", h)
        temp = self._q("nvmlDeviceGetTemperature", h, pynvml.NVML_TEMPERATURE_GPU)
        sm = self._q("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_SM, key="clock_sm")
        memclk = self._q("nvmlDeviceGetClockInfo", h, pynvml.NVML_CLOCK_MEM, key="clock_mem")
        mask = self._q("nvmlDeviceGetCurrentClocksEventReasons", h)
        if mask is None:
            mask = self._q("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        tx, rx = self._pcie_cached(i, h, now)
        ecc_cur, ecc_pend = self._ecc_cached(i, h, now)
        st = self._static[i]
        return GpuSample(
            index=i,
            uuid=st.uuid,
            name=st.name,
            compute_capability=st.cc,
            memory_total=total,
            memory_used=used,
            memory_reserved=reserved,
            util_gpu=float(util.gpu) if util is not None else None,
            util_mem=float(util.memory) if util is not None else None,
            power_w=power / 1000.0 if power is not None else None,
            power_limit_w=limit / 1000.0 if limit is not None else None,
            temperature_c=float(temp) if temp is not None else None,
            sm_clock_mhz=sm,
            mem_clock_mhz=memclk,
            throttle_reasons=decode_throttle(mask),
            pcie_tx_kbs=tx,
            pcie_rx_kbs=rx,
            ecc_current=ecc_cur,
            ecc_pending=ecc_pend,
            processes=self._processes(h),
            ts=now,
        )

    def _pcie_cached(self, i: int, h: object, now: float) -> tuple[float | None, float | None]:
        t, tx, rx = self._pcie.get(i, (0.0, None, None))
        if now - t >= self._pcie_interval:
            tx = self._q("nvmlDeviceGetPcieThroughput", h, pynvml.NVML_PCIE_UTIL_TX_BYTES, key="pcie_tx")  # ~20 ms
            rx = self._q("nvmlDeviceGetPcieThroughput", h, pynvml.NVML_PCIE_UTIL_RX_BYTES, key="pcie_rx")
            tx = float(tx) if tx is not None else None
            rx = float(rx) if rx is not None else None
            self._pcie[i] = (now, tx, rx)
        return tx, rx

    def _ecc_cached(self, i: int, h: object, now: float) -> tuple[bool | None, bool | None]:
        t, cur, pend = self._ecc.get(i, (0.0, None, None))
        if now - t >= self._ecc_ttl:
            mode = self._q("nvmlDeviceGetEccMode", h)
            cur, pend = (bool(mode[0]), bool(mode[1])) if mode else (None, None)
            self._ecc[i] = (now, cur, pend)
        return cur, pend

    def _processes(self, h: object) -> tuple[GpuProcess, ...]:
        """The compute processes as the driver lists them (untagged: the telemetry hub marks the engine's)."""
        procs = self._q("nvmlDeviceGetComputeRunningProcesses", h) or []
        out = []
        for p in procs:
            pid = int(getattr(p, "pid", 0))
            used = getattr(p, "usedGpuMemory", None)
            out.append(GpuProcess(pid=pid, used_bytes=int(used) if used is not None else None,
                                  name=self._proc_name(pid)))
        return tuple(out)

    def _proc_name(self, pid: int) -> str:
        name = self._proc_names.get(pid)
        if name is None:
            import psutil

            try:
                name = psutil.Process(pid).name()
            except (psutil.Error, OSError):  # pid in another namespace / gone: N/A
                name = ""
            if len(self._proc_names) > 256:
                self._proc_names.clear()
            self._proc_names[pid] = name
        return name


def _init_error(exc: Exception) -> str:
    if isinstance(exc, pynvml.NVMLError_LibraryNotFound):
        return NO_LIBRARY
    if isinstance(exc, pynvml.NVMLError_DriverNotLoaded):
        return "no NVIDIA GPU (the NVIDIA driver is not loaded)"
    if isinstance(exc, pynvml.NVMLError_LibRmVersionMismatch):
        return "NVIDIA driver/library version mismatch (driver upgraded without reboot?): " + str(exc)
    if isinstance(exc, pynvml.NVMLError_NoPermission):
        return "NVML: no permission to open the GPU device files: " + str(exc)
    return f"NVML unavailable: {type(exc).__name__}: {exc}"
