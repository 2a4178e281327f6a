"""GPU readers: NVML over a fake pynvml module, selection, the SIMULATED card, the scriptable fake."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pynvml
import pytest

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.config.env import GPU as ENV_GPU
from app.backend.telemetry.gpu import NoGpuReader, follow_engine, make_gpu_reader, tag_engine_processes
from app.backend.telemetry.gpu_sim import FakeGpuReader, SimulatedGpuReader, sample_from_dict
from app.backend.telemetry.nvml import NO_LIBRARY, NvmlGpuReader, decode_throttle

GIB = 2**30


class FakeNvml:
    """Just enough of pynvml: two H200-like GPUs, with call counting and injectable failures."""

    def __init__(self, init_error: Exception | None = None) -> None:
        self.init_error = init_error
        self.calls: dict[str, int] = {}
        self.fail: dict[str, Exception] = {}
        self.procs = [SimpleNamespace(pid=419, usedGpuMemory=2_787_115_008), SimpleNamespace(pid=77, usedGpuMemory=None)]
        self.throttle = 0x4 | 0x20

    def __getattr__(self, name):
        raise AttributeError(name)

    def _c(self, name):
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.fail:
            raise self.fail[name]

    def nvmlInit(self):
        self._c("nvmlInit")
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        self._c("nvmlShutdown")

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return f"h{i}"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h}"

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H200"

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        self._c("mem")
        if version == pynvml.nvmlMemory_v2:
            return SimpleNamespace(total=150_754_820_096, used=2_796_355_584, reserved=644_939_776, free=0)
        return SimpleNamespace(total=150_754_820_096, used=3_441_295_360, free=0)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=37, memory=12)

    def nvmlDeviceGetPowerUsage(self, h):
        self._c("nvmlDeviceGetPowerUsage")
        return 99_579

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700_000

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 39

    def nvmlDeviceGetClockInfo(self, h, clk):
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201}[clk]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        self._c("nvmlDeviceGetCurrentClocksEventReasons")
        return self.throttle

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        self._c("pcie")
        return 1048 if counter == pynvml.NVML_PCIE_UTIL_TX_BYTES else 2096

    def nvmlDeviceGetEccMode(self, h):
        self._c("ecc")
        return [1, 1]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self.procs if h == "h0" else []


def test_nvml_reader_reads_every_field() -> None:
    nv = FakeNvml()
    r = NvmlGpuReader(nvml=nv)
    assert r.available and r.error == ""
    g0, g1 = r.read()
    assert (g0.index, g0.uuid, g0.name, g0.compute_capability) == (0, "GPU-h0", "NVIDIA H200", (9, 0))
    assert (g0.memory_total, g0.memory_used, g0.memory_reserved) == (150_754_820_096, 2_796_355_584, 644_939_776)
    assert g0.memory_in_use == 2_796_355_584  # = v2 used: nvidia-smi's figure on driver 580 (the reserve apart)
    assert (g0.util_gpu, g0.util_mem, g0.power_w, g0.power_limit_w, g0.temperature_c) == (37, 12, 99.579, 700.0, 39)
    assert (g0.sm_clock_mhz, g0.mem_clock_mhz) == (1980, 3201)
    assert g0.throttle_reasons == ("sw_power_cap", "sw_thermal")
    assert (g0.pcie_tx_kbs, g0.pcie_rx_kbs, g0.ecc_current, g0.ecc_pending) == (1048, 2096, True, True)
    assert not any(p.container for p in g0.processes)  # raw samples: the hub marks the engine's processes
    engine = [p for p in tag_engine_processes([g0], {419}, "ds4-quality")[0].processes if p.container]
    assert [(p.pid, p.container, p.used_bytes) for p in engine] == [(419, "ds4-quality", 2_787_115_008)]
    assert [p.used_bytes for p in g0.processes if p.pid == 77] == [None]  # N/A stays N/A
    assert g1.processes == () and not g0.simulated


def test_nvml_pcie_and_ecc_on_their_own_cadence() -> None:
    nv = FakeNvml()
    r = NvmlGpuReader(nvml=nv, pcie_interval_s=3600, ecc_ttl_s=3600)
    for _ in range(5):
        r.read()
    assert nv.calls["pcie"] == 4  # 2 GPUs × (tx, rx), once — not per read
    assert nv.calls["ecc"] == 2
    assert nv.calls["nvmlDeviceGetPowerUsage"] == 10  # fast set every read
    assert nv.calls["nvmlInit"] == 1


def test_nvml_errors_become_na_and_missing_functions_are_not_retried() -> None:
    nv = FakeNvml()
    nv.fail["nvmlDeviceGetPowerUsage"] = pynvml.NVMLError_NotSupported("Not Supported")
    nv.fail["nvmlDeviceGetCurrentClocksEventReasons"] = pynvml.NVMLError_FunctionNotFound("Function Not Found")
    nv.throttle = 0x40
    r = NvmlGpuReader(nvml=nv)
    g = r.read()[0]
    assert g.power_w is None and g.memory_total > 0
    r.read()
    assert nv.calls["nvmlDeviceGetPowerUsage"] == 1  # remembered as unsupported
    assert nv.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    # the old ThrottleReasons call is the fallback; FakeNvml lacks it → no reasons, no exception
    assert g.throttle_reasons == ()


def test_nvml_transient_error_is_retried_and_never_raises() -> None:
    nv = FakeNvml()
    nv.fail["mem"] = pynvml.NVMLError_GpuIsLost("GPU is lost")
    r = NvmlGpuReader(nvml=nv)
    g = r.read()[0]
    assert (g.memory_total, g.memory_used) == (0, 0)
    del nv.fail["mem"]
    assert r.read()[0].memory_total == 150_754_820_096


def test_nvml_memory_v1_fallback_when_v2_unsupported() -> None:
    nv = FakeNvml()
    orig = nv.nvmlDeviceGetMemoryInfo
    nv.nvmlDeviceGetMemoryInfo = lambda h, version=None: (_ for _ in ()).throw(pynvml.NVMLError_NotSupported()) if version else orig(h)
    g = NvmlGpuReader(nvml=nv).read()[0]
    assert (g.memory_used, g.memory_reserved) == (3_441_295_360, 0)


def test_no_driver_is_a_clear_state() -> None:
    r = NvmlGpuReader(nvml=FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound("NVML Shared Library Not Found")))
    assert not r.available and r.error == NO_LIBRARY == "no NVIDIA GPU (libnvidia-ml.so not found)"
    assert r.read() == []


def test_decode_throttle_bits() -> None:
    assert decode_throttle(0) == () and decode_throttle(None) == ()
    assert decode_throttle(0x1) == ("gpu_idle",)
    assert decode_throttle(0x4 | 0x40 | 0x80) == ("sw_power_cap", "hw_thermal", "hw_power_brake")


def test_selection_and_env_override(monkeypatch, tmp_path) -> None:
    from app.backend.recipe import DEFAULT_RECIPE, SIMULATED_RECIPE
    from app.backend.config.settings import resolve_settings

    demo = resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)
    monkeypatch.delenv(ENV_GPU, raising=False)
    # this CI machine has no libnvidia-ml.so: demo → SIMULATED card, non-demo → "no GPU" state
    assert isinstance(make_gpu_reader(demo), SimulatedGpuReader)
    real = make_gpu_reader(resolve_settings(DEFAULT_RECIPE, tmp_path, demo=False))  # the SIMULATED recipe is demo
    assert isinstance(real, NoGpuReader) and not real.available and "no NVIDIA GPU" in real.error
    monkeypatch.setenv(ENV_GPU, "none")
    assert make_gpu_reader(demo).error == "GPU reading disabled (MOET_PANEL_GPU=none)"
    monkeypatch.setenv(ENV_GPU, "simulated")
    assert make_gpu_reader(None).read()[0].simulated
    monkeypatch.setenv(ENV_GPU, "bogus")
    with pytest.raises(ValueError, match="nvml, simulated or none"):
        make_gpu_reader(demo)


def test_simulated_card_follows_engine_lifecycle() -> None:
    clock = [1000.0]
    snap = [EngineSnapshot(state=EngineState.STOPPED, since=1000.0)]
    r = SimulatedGpuReader(lambda: snap[0], total_gib=96, ready_gib=93.8, boot_s=4, release_s=2, clock=lambda: clock[0])

    def in_use() -> float:
        g = r.read()[0]
        assert g.simulated and "SIMULATED" in g.name and g.memory_total == 96 * GIB
        return g.memory_in_use / GIB

    assert in_use() == 0.0
    snap[0] = EngineSnapshot(state=EngineState.STARTING, since=1000.0)
    clock[0] = 1001.0
    a = in_use()
    clock[0] = 1003.0
    b = in_use()
    assert 0 < a < b < 93.8  # ramps while booting
    snap[0] = EngineSnapshot(state=EngineState.READY, since=1004.0)
    clock[0] = 1005.0
    assert in_use() == pytest.approx(93.8, abs=0.05)
    snap[0] = EngineSnapshot(state=EngineState.STOPPING, since=1010.0)
    clock[0] = 1011.0
    assert 0 < in_use() < 93.8
    clock[0] = 1013.0
    assert in_use() == 0.0  # released: nvidia-smi shows 0 (the driver's reserve is shown apart)
    assert r.read()[0].memory_reserved == pytest.approx(0.45 * GIB, rel=0.01)
    snap[0] = EngineSnapshot(state=EngineState.STOPPED, since=1013.0)
    assert in_use() == 0.0


def test_fake_reader_script_and_errors(tmp_path) -> None:
    spec = {"frames": [[{"memory_total_gib": 96, "memory_used_gib": 93}], [{"memory_total_gib": 96, "memory_used_gib": 1}]]}
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(spec))
    r = FakeGpuReader.from_json(path)
    assert [round(r.read()[0].memory_used / GIB) for _ in range(3)] == [93, 1, 1]  # last frame repeats
    assert r.read_count == 3
    r.set_error("no NVIDIA GPU (libnvidia-ml.so not found)")
    assert not r.available and r.read() == []
    with pytest.raises(ValueError, match="unknown GPU sample field"):
        sample_from_dict({"vram": 1})


def test_simulated_card_is_fed_explicitly() -> None:
    class Engine:  # the EngineFeed slice the card follows
        def snapshot(self) -> EngineSnapshot:
            return EngineSnapshot(state=EngineState.READY, since=0.0, container_name="ds4-sim")

        def container_pids(self) -> set[int]:
            return {4711}

        def add_log_listener(self, cb):
            return lambda: None

        def recent_logs(self, n: int = 250) -> list:
            return []

    card = SimulatedGpuReader(total_gib=96, ready_gib=93.8, clock=lambda: 10.0)
    assert card.read()[0].memory_in_use == 0  # no engine yet: a stopped one
    assert follow_engine(card, Engine()) is card and follow_engine(FakeGpuReader(), Engine()) is None
    idle = card.read()[0]
    assert [(p.pid, p.container) for p in idle.processes] == [(4711, "ds4-sim")]
    card.set_load(1.0)  # what the hub measures on /metrics
    assert card.read()[0].util_gpu > idle.util_gpu


class FlakyCountNvml(FakeNvml):
    """NVML busy at boot: the count (or GPU 1's handle) fails the first `fails` times."""

    def __init__(self, fails: int, what: str = "count") -> None:
        super().__init__()
        self.fails, self.what = fails, what

    def _flaky(self) -> None:
        if self.fails > 0:
            self.fails -= 1
            raise pynvml.NVMLError_Timeout()

    def nvmlDeviceGetCount(self):
        if self.what == "count":
            self._flaky()
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.what == "handle" and i == 1:
            self._flaky()
        return f"h{i}"


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


@pytest.mark.parametrize("what", ["count", "handle"])
def test_a_gpu_count_nvml_fails_at_start_is_asked_again_never_taken_as_one(what: str) -> None:
    from app.backend.telemetry.gpu import box_gpu_count

    r = NvmlGpuReader(nvml=FlakyCountNvml(fails=3, what=what))
    assert r.count_error and not r.available  # neither "0 devices" nor GPU 0 alone
    clock = _Clock()
    assert box_gpu_count(r, deadline_s=20, retry_s=1, clock=clock, sleep=clock.sleep) == 2
    # the start and two retries failed, one second apart; the third retry counts both GPUs
    assert clock.t == 2 and r.available and not r.count_error and len(r.read()) == 2


def test_a_gpu_count_that_keeps_failing_refuses_to_start_and_says_what_to_do() -> None:
    from app.backend.contracts import GpuCountError
    from app.backend.telemetry.gpu import box_gpu_count

    r = NvmlGpuReader(nvml=FlakyCountNvml(fails=10**6, what="handle"))
    clock = _Clock()
    with pytest.raises(GpuCountError) as err:
        box_gpu_count(r, deadline_s=20, retry_s=1, clock=clock, sleep=clock.sleep)
    assert 20 <= clock.t <= 21
    assert "nvidia-smi" in str(err.value) and "start the panel again" in str(err.value)


def test_a_box_without_a_driver_still_has_its_one_engine() -> None:
    from app.backend.telemetry.gpu import box_gpu_count

    r = NvmlGpuReader(nvml=FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound("NVML Shared Library Not Found")))
    assert box_gpu_count(r, clock=lambda: 0.0, sleep=lambda s: pytest.fail("no retry without a driver")) == 1
