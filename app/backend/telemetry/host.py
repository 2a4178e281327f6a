"""Host sampler (psutil): CPU, RAM, swap, free disk of the data dir, disk and network rates."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")


@dataclass(frozen=True)
class HostSample:
    ts: float
    cpu_pct: float | None = None
    ram_total: int = 0
    ram_available: int = 0
    swap_total: int = 0
    swap_used: int = 0
    disk_path: str = ""
    disk_free: int | None = None
    disk_total: int | None = None
    disk_read_bps: float | None = None
    disk_write_bps: float | None = None
    net_rx_bps: float | None = None
    net_tx_bps: float | None = None

    @property
    def ram_used_pct(self) -> float | None:
        return 100.0 * (1 - self.ram_available / self.ram_total) if self.ram_total else None


class HostSampler:
    """Rates are deltas between successive `sample()` calls (the first call has none)."""

    def __init__(self, data_dir: str | Path | None = None) -> None:
        self._dir = Path(data_dir) if data_dir else Path.home()
        self._prev: tuple[float, tuple[int, int] | None, tuple[int, int] | None] | None = None
        psutil.cpu_percent(interval=None)  # prime: the first non-blocking call returns 0.0

    def _existing_dir(self) -> Path:
        p = self._dir
        while not p.exists() and p != p.parent:
            p = p.parent  # the data dir may not exist yet: report the disk it will live on
        return p

    def sample(self) -> HostSample:
        now = time.monotonic()
        vm = psutil.virtual_memory()
        sw = _safe(psutil.swap_memory)
        path = self._existing_dir()
        du = _safe(lambda: psutil.disk_usage(str(path)))
        dio = _safe(lambda: psutil.disk_io_counters(perdisk=False))
        nio = _safe(lambda: psutil.net_io_counters(pernic=False))
        disk = (dio.read_bytes, dio.write_bytes) if dio else None
        net = (nio.bytes_recv, nio.bytes_sent) if nio else None
        rates: list[float | None] = [None] * 4
        if self._prev is not None:
            dt = now - self._prev[0]
            if dt > 0:
                rates[0:2] = _rates(disk, self._prev[1], dt)
                rates[2:4] = _rates(net, self._prev[2], dt)
        self._prev = (now, disk, net)
        return HostSample(
            ts=time.time(),
            cpu_pct=psutil.cpu_percent(interval=None),
            ram_total=vm.total,
            ram_available=vm.available,
            swap_total=sw.total if sw else 0,
            swap_used=sw.used if sw else 0,
            disk_path=str(path),
            disk_free=du.free if du else None,
            disk_total=du.total if du else None,
            disk_read_bps=rates[0],
            disk_write_bps=rates[1],
            net_rx_bps=rates[2],
            net_tx_bps=rates[3],
        )


def _rates(cur: tuple[int, int] | None, prev: tuple[int, int] | None, dt: float) -> list[float | None]:
    if cur is None or prev is None:
        return [None, None]
    return [max(c - p, 0) / dt for c, p in zip(cur, prev, strict=True)]


def _safe(fn: Callable[[], T]) -> T | None:
    """psutil calls that can fail in containers (no /proc/diskstats, …) → None."""
    try:
        return fn()
    except (OSError, RuntimeError, NotImplementedError, psutil.Error):  # not in this container: N/A, not an error
        return None
