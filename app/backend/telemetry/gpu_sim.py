"""GPU readers that need no NVML: the demo-mode SIMULATED card and the scriptable fake for tests.

`SimulatedGpuReader` is what demo mode shows: an "RTX PRO 6000 (SIMULATED)" 96 GiB card whose VRAM
follows the engine snapshot (0 stopped, ramping while it boots, the card's ~93.8 GiB when ready,
freed after stop). Every sample carries `simulated=True` so the UI labels it. It is fed explicitly:
the engine it pretends to serve through `follow(engine)` (or the functions given to the constructor),
the decode load through `set_load()` (the telemetry hub, from /metrics). `count` > 1 (MOET_PANEL_SIM_GPUS, demo
only) makes a SIMULATED box of that many identical cards, card i following the engine given by
`follow(engine, index=i)` (docs/engine.md, "Several GPUs").

`FakeGpuReader` replays samples given as dicts/JSON (or GpuSample objects); tests and the engine
helper use it to script VRAM for preflight and memory-release waits.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import fields
from pathlib import Path
from collections.abc import Sequence
from typing import Callable

from app.backend import oplog
from app.backend.contracts import EngineFeed, EngineSnapshot, EngineState, GpuProcess, GpuSample, ReaderStatus
from app.backend.contracts import GiB, JsonObject

SIM_NAME = "RTX PRO 6000 (SIMULATED)"
SIM_UUID = "GPU-00000000-5151-4d55-4c41-544544000000"


class SimulatedGpuReader(ReaderStatus):
    """A deterministic pretend card driven by the engine's lifecycle; clearly labelled SIMULATED."""

    _simulated = True

    def __init__(
        self,
        engine_snapshot_fn: Callable[[], EngineSnapshot] | None = None,
        total_gib: float = 96.0,
        ready_gib: float = 93.8,
        boot_s: float = 4.0,
        release_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        engine_pids_fn: Callable[[], set[int]] | None = None,
        count: int = 1,
    ) -> None:
        self._count = max(1, count)
        # card index -> (its engine's snapshot, its engine's pids); a card no engine follows reads as stopped
        self._feeds: dict[int, tuple[Callable[[], EngineSnapshot] | None, Callable[[], set[int]] | None]] = {
            0: (engine_snapshot_fn, engine_pids_fn)}
        self._errors = oplog.Once("telemetry")
        self._load: dict[int, float] = {}  # card index -> 0..1 (decode busy → util up)
        self._total = total_gib
        self._ready = ready_gib
        self._boot_s = max(boot_s, 0.1)
        self._release_s = max(release_s, 0.1)
        self._clock = clock
        self._reserved = 0.45  # GiB the driver keeps for itself on a real card

    @property
    def count(self) -> int:
        """How many SIMULATED cards this box has."""
        return self._count

    def follow(self, engine: EngineFeed, index: int = 0) -> None:
        """Pretend to be this engine's GPU (card `index`): its lifecycle drives the VRAM, its process holds it."""
        self._feeds[index] = (engine.snapshot, engine.container_pids)

    def set_load(self, fraction: float, index: int = 0) -> None:
        """How busy decoding is on card `index` (0..1: measured decode speed / the card's); drives its
        utilisation and power."""
        self._load[index] = min(max(fraction, 0.0), 1.0)

    def _snapshot(self, index: int) -> EngineSnapshot:
        snapshot_fn = self._feeds.get(index, (None, None))[0]
        if snapshot_fn is None:
            return EngineSnapshot()
        try:
            return snapshot_fn()
        except Exception as exc:  # the SIMULATED readings go on as if idle
            self._errors.caught(exc, "reading the engine snapshot for the SIMULATED GPU")
            return EngineSnapshot()

    def vram_in_use_gib(self, snap: EngineSnapshot, now: float) -> float:
        """Used memory the card would show for this engine state, as nvidia-smi shows it (the reserve apart)."""
        elapsed = max(now - snap.since, 0.0)
        st = snap.state
        if st in (EngineState.STARTING, EngineState.PREFLIGHT):
            frac = min(elapsed / self._boot_s, 0.97) if st is EngineState.STARTING else 0.0
            return self._ready * frac
        if st is EngineState.READY:
            wobble = 0.04 * math.sin(now / 7.0)  # KV/activations move a little
            return self._ready + wobble
        if st is EngineState.STOPPING:
            frac = max(1.0 - elapsed / self._release_s, 0.0)
            return self._ready * frac
        return 0.0

    def read(self) -> list[GpuSample]:
        now = self._clock()
        return [self._card(i, now) for i in range(self._count)]

    def _card(self, index: int, now: float) -> GpuSample:
        snap = self._snapshot(index)
        pids_fn = self._feeds.get(index, (None, None))[1]
        in_use = self.vram_in_use_gib(snap, now)
        load = self._load.get(index, 0.0)
        busy = snap.state is EngineState.READY and load > 0.05
        util = min(97.0, 20.0 + 77.0 * load) if busy else (35.0 if snap.state is EngineState.STARTING else 0.0)
        procs: tuple[GpuProcess, ...] = ()
        if in_use > 0.01:
            pids = sorted(pids_fn() if pids_fn else ()) or [4242 + index]
            procs = (GpuProcess(pid=pids[0], used_bytes=int(in_use * GiB),
                                name="vllm (SIMULATED)", container=snap.container_name or "engine"),)
        return GpuSample(
            index=index,
            uuid=SIM_UUID if index == 0 else f"{SIM_UUID[:-3]}{index:03d}",
            name=SIM_NAME,
            compute_capability=(12, 0),
            memory_total=int(self._total * GiB),
            memory_used=int(in_use * GiB),
            memory_reserved=int(self._reserved * GiB),  # always held by the driver, shown apart
            util_gpu=util,
            util_mem=util * 0.6,
            power_w=round(55.0 + 5.4 * util, 1),
            power_limit_w=600.0,
            temperature_c=round(34.0 + 0.4 * util, 1),
            sm_clock_mhz=2430 if util > 0 else 600,
            mem_clock_mhz=14001 if util > 0 else 810,
            throttle_reasons=() if util > 0 else ("gpu_idle",),
            pcie_tx_kbs=0.0,
            pcie_rx_kbs=1200.0 * util,
            ecc_current=False,
            ecc_pending=False,
            processes=procs,
            ts=now,
            simulated=True,
        )


_SAMPLE_FIELDS = frozenset(f.name for f in fields(GpuSample))


def sample_from_dict(d: JsonObject, index: int = 0) -> GpuSample:
    """Build a GpuSample from a plain dict; `*_gib` keys are accepted for memory fields."""
    data = dict(d)
    for key in ("memory_total", "memory_used", "memory_reserved"):
        if f"{key}_gib" in data:
            data[key] = int(float(data.pop(f"{key}_gib")) * GiB)
    data.setdefault("index", index)
    data.setdefault("uuid", f"GPU-fake-{data['index']}")
    data.setdefault("name", "Fake GPU")
    data.setdefault("compute_capability", None)
    data.setdefault("memory_total", 0)
    data.setdefault("memory_used", 0)
    data.setdefault("memory_reserved", 0)
    if data.get("compute_capability") is not None:
        data["compute_capability"] = tuple(data["compute_capability"])
    data["throttle_reasons"] = tuple(data.get("throttle_reasons", ()))
    data["processes"] = tuple(
        p if isinstance(p, GpuProcess) else GpuProcess(**p) for p in data.get("processes", ())
    )
    unknown = set(data) - _SAMPLE_FIELDS
    if unknown:
        raise ValueError(f"unknown GPU sample field(s): {', '.join(sorted(unknown))}")
    return GpuSample(**data)


class FakeGpuReader(ReaderStatus):
    """Scriptable reader: each read() returns the next frame (the last one repeats).

    Examples:
        >>> r = FakeGpuReader.from_dict({"frames": [[{"memory_total_gib": 96, "memory_used_gib": 90}]]})
        >>> r.read()[0].memory_used // GiB
        90
        >>> FakeGpuReader(error="no NVIDIA GPU (libnvidia-ml.so not found)").available
        False
    """

    def __init__(self, frames: list[list[GpuSample]] | None = None, error: str = "") -> None:
        self._frames = list(frames or [])
        self._error = error
        self._lock = threading.Lock()
        self.read_count = 0

    @classmethod
    def from_dict(cls, spec: JsonObject) -> FakeGpuReader:
        """{"error": str?, "gpus": [sample...]} (one frame) or {"frames": [[sample...], ...]}."""
        frames_raw = spec.get("frames") or ([spec["gpus"]] if "gpus" in spec else [])
        frames = [[sample_from_dict(g, i) for i, g in enumerate(frame)] for frame in frames_raw]
        return cls(frames, error=spec.get("error", ""))

    @classmethod
    def from_json(cls, path: str | Path) -> FakeGpuReader:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def push(self, frame: Sequence[GpuSample | JsonObject]) -> None:
        """Append a frame (tests drive VRAM over time this way)."""
        with self._lock:
            self._frames.append([g if isinstance(g, GpuSample) else sample_from_dict(g, i) for i, g in enumerate(frame)])

    def set_error(self, error: str) -> None:
        self._error = error

    def read(self) -> list[GpuSample]:
        with self._lock:
            self.read_count += 1
            if self._error or not self._frames:
                return []
            frame = self._frames.pop(0) if len(self._frames) > 1 else self._frames[0]
            return list(frame)
