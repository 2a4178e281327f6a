"""VRAM as nvidia-smi shows it (issue 43 item 6): the driver's reserve is apart from "used", so the header, the
/metrics gauge and the "VRAM > 98 %" alert agree with nvidia-smi (docs/engine.md, "VRAM as nvidia-smi shows it")."""

from __future__ import annotations

from app.backend.alerts.rules import AlertInputs, vram_full
from app.backend.telemetry.gpu_sim import sample_from_dict


def test_reserve_is_not_counted_as_used() -> None:
    # The H200 figures (driver 580): nvidia-smi 1,139 MiB used; NVML v2 reserve 615 MiB.
    g = sample_from_dict({"memory_total": 143771 * 2**20, "memory_used": 1139 * 2**20,
                          "memory_reserved": 615 * 2**20})
    assert g.memory_in_use == 1139 * 2**20


def test_vram_alert_uses_nvidia_smis_used() -> None:
    # 97.8 % used as nvidia-smi shows it, the reserve on top would cross 98 %: no alert (nvidia-smi says 97.8 %).
    calm = sample_from_dict({"memory_total_gib": 100, "memory_used_gib": 97.8, "memory_reserved_gib": 0.6})
    assert vram_full(AlertInputs(gpus=[calm])) is None
    full = sample_from_dict({"memory_total_gib": 100, "memory_used_gib": 98.5, "memory_reserved_gib": 0.6})
    alert = vram_full(AlertInputs(gpus=[full]))
    assert alert is not None and "98.5 of 100.0 GiB" in alert.meaning


def test_simulated_box_of_n_gpus(monkeypatch) -> None:
    from app.backend.config import env
    from app.backend.contracts import EngineSnapshot, EngineState
    from app.backend.telemetry.gpu import make_gpu_reader
    from app.backend.telemetry.gpu_sim import SimulatedGpuReader

    monkeypatch.setenv(env.SIM_GPUS, "3")
    reader = make_gpu_reader(None, mode="simulated")
    assert isinstance(reader, SimulatedGpuReader)
    assert [g.index for g in reader.read()] == [0, 1, 2] and len({g.uuid for g in reader.read()}) == 3

    class Engine:  # the EngineFeed slice a card follows
        def snapshot(self) -> EngineSnapshot:
            return EngineSnapshot(state=EngineState.READY, since=0.0, container_name="sim-gpu1")

        def container_pids(self) -> set[int]:
            return {77}

        def add_log_listener(self, cb):
            return lambda: None

        def recent_logs(self, n: int = 250) -> list:
            return []

    reader.follow(Engine(), index=1)  # GPU 1's engine serves; GPUs 0 and 2 stay idle
    used = [g.memory_used for g in reader.read()]
    assert used[0] == 0 and used[2] == 0 and used[1] > 90 * 2**30
    assert reader.read()[1].processes[0].container == "sim-gpu1"
    for bad in ("0", "17", "two"):
        monkeypatch.setenv(env.SIM_GPUS, bad)
        try:
            env.sim_gpus()
        except ValueError as exc:
            assert env.SIM_GPUS in str(exc)
        else:
            raise AssertionError(f"{bad!r} accepted")
