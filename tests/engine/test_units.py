"""Unit tests without Docker: boot-phase parsing, state machine, pool expectation, GPU-release wait,
preflight items with a fake GPU reader, line splitting, log persistence bounds, --gpus mapping."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.backend.engine.decider import statemachine as sm
from app.backend.engine.logs.bootlog import BootTracker
from app.backend.engine.controller import ControllerOptions, EngineController, expects_pool
from app.backend.engine.runtime.docker import gpu_device_requests
from app.backend.engine.logs.logstore import LogStore
from app.backend.engine.lifecycle.preflight import PreflightInputs, run_preflight
from app.backend.engine.runtime.base import LineSplitter
from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState, GpuProcess, GpuSample, LogLine
from app.backend.recipe import DEFAULT_RECIPE, load_recipe
from app.backend.config.settings import Settings
from app.backend.telemetry.gpu_sim import FakeGpuReader

# The genuine engine logs live in the repo (copied from the project's shared fixtures; see their README).
FIXTURES = Path(__file__).resolve().parents[1] / "telemetry" / "fixtures" / "engine-logs"
GIB = 1 << 30


# -- boot log ---------------------------------------------------------------------------------
def _feed(lines: list[str]) -> BootTracker:
    t = BootTracker()
    for ln in lines:
        t.feed(ln)
    return t


def test_pool_line_from_genuine_engine_log() -> None:
    path = FIXTURES / "boot_tp1_5.5gib_packstore_trace1_nodump.log"
    p = _feed(path.read_text().splitlines()).progress
    assert p.pool is not None and (p.pool.slots, p.pool.slot_mib) == (469, 12.0)


def test_auto_pool_disabled_line_means_zero_slots() -> None:
    path = FIXTURES / "disabled_auto_0slots_trace1_every64.log"
    p = _feed(path.read_text().splitlines()).progress
    assert p.pool is not None and p.pool.slots == 0 and p.pool.disabled
    assert "DISABLED" in p.phase


def test_boot_phases_in_order_and_cache_miss() -> None:
    pre = "(EngineCore_DP0 pid=7) INFO 11-30 04:00:00 [x.py:1] "
    t = BootTracker()
    t.feed(pre + "moe_w2 LOADER-SKIP armed: pack-resident expert layers ...")
    assert "loader-skip" in t.progress.phase
    t.feed(pre + "moe_w2: layer 0 planes from cache")
    t.feed(pre + "moe_w2: layer 1 planes from cache")
    assert t.progress.phase == "planes from cache 2/43"
    t.feed(pre + "moe_w2 delta tier: 597 slots x 12.0 MiB (7.00 GiB pool)")
    assert t.progress.pool is not None and t.progress.pool.slots == 597 and "pool sized" in t.progress.phase
    t.feed(pre + "Available KV cache memory: 10.78 GiB")
    assert t.progress.phase == "KV cache"
    t.feed(pre + "Graph capturing finished in 1 secs, took 0.52 GiB")
    assert t.progress.phase == "CUDA graphs"
    t.feed("\x1b[32mINFO\x1b[0m:     Application startup complete.")
    assert t.progress.api_up and t.progress.phase == "API up"
    assert not t.progress.cache_miss
    t2 = BootTracker()
    t2.feed(pre + "moe_w2: layer 0 planes built (1.69 GiB)")
    assert t2.progress.cache_miss and "MISS" in t2.progress.phase


# -- state machine ------------------------------------------------------------------------------
def test_state_machine_happy_path_and_illegal_moves() -> None:
    s = EngineSnapshot()
    s = sm.transition(s, sm.PreflightBegan("quality"))
    s = sm.transition(s, sm.BootBegan("quality", "cid", "name", "http://x", "m", True))
    s = sm.transition(s, sm.BootProgressed("planes from cache 3/43"))
    assert s.state is EngineState.STARTING and s.phase == "planes from cache 3/43"
    s = sm.transition(s, sm.BecameReady("ok"))
    assert s.state is EngineState.READY and s.last_ready_profile == "quality"
    with pytest.raises(sm.IllegalTransition):
        sm.transition(s, sm.BootProgressed("late line"))  # a ready engine never goes back to booting
    with pytest.raises(sm.IllegalTransition):
        sm.transition(s, sm.BecameReady())
    s = sm.transition(s, sm.StopBegan())
    s = sm.transition(s, sm.Stopped("bye"))
    assert s.state is EngineState.STOPPED and not s.container_id
    with pytest.raises(sm.IllegalTransition):
        sm.transition(s, sm.Stopped())


def test_failed_keeps_diagnosis_and_can_restart() -> None:
    d = Diagnosis("killed", "t", "e", "f")
    s = sm.transition(sm.transition(EngineSnapshot(), sm.PreflightBegan("q")), sm.Failed(d))
    assert s.state is EngineState.FAILED and s.diagnosis == d
    assert sm.transition(s, sm.PreflightBegan("q")).diagnosis is None


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({"VLLM_MOE_W2": "1", "VLLM_MOE_W2_DELTA_GB": "7"}, True),
        ({"VLLM_MOE_W2": "1", "VLLM_MOE_W2_DELTA_GB": "0"}, False),
        ({"VLLM_MOE_W2": "1", "VLLM_MOE_W2_DELTA_GB": "auto"}, True),
        ({"VLLM_MOE_W2": "1"}, True),  # unset + W2 on = 2 GiB default tier
        ({"VLLM_MOE_W2": "1", "VLLM_MOE_W2_DELTA": "0", "VLLM_MOE_W2_DELTA_GB": "7"}, False),
        ({}, False),
    ],
)
def test_expects_pool(env: dict[str, str], want: bool) -> None:
    assert expects_pool(env) is want


# -- GPU memory release wait (fake GPU reader) --------------------------------------------------
def _gpu(used_gib: float, procs: tuple[GpuProcess, ...] = (), ecc: bool | None = False, cc=(12, 0), total=96) -> GpuSample:
    return GpuSample(index=0, uuid="GPU-x", name="NVIDIA RTX PRO 6000 Blackwell", compute_capability=cc,
                     memory_total=int(total * GIB), memory_used=int(used_gib * GIB), memory_reserved=0,
                     ecc_current=ecc, processes=procs)


def _controller(tmp_path: Path, reader, timeout: float) -> EngineController:
    recipe = load_recipe(DEFAULT_RECIPE)
    st = Settings(DEFAULT_RECIPE, recipe, tmp_path, False)
    return EngineController(st, None, gpu_reader=reader,
                            options=ControllerOptions(reattach=False, gpu_release_timeout_s=timeout, poll_interval_s=0.01))


def test_memory_release_wait_polls_until_released(tmp_path: Path) -> None:
    frames = [[_gpu(90, (GpuProcess(4242, 90 * GIB),))]] * 3 + [[_gpu(40)]] * 2 + [[_gpu(0.5)]]
    reader = FakeGpuReader(frames)
    ctl = _controller(tmp_path, reader, timeout=10)
    assert ctl._boot.wait_gpu_release({4242}) is True
    assert reader.read_count == 6  # waited through the old pid and the still-high memory


def test_memory_release_wait_gives_up_at_deadline(tmp_path: Path) -> None:
    reader = FakeGpuReader([[_gpu(90, (GpuProcess(4242, 90 * GIB),))]])
    ctl = _controller(tmp_path, reader, timeout=0.2)
    assert ctl._boot.wait_gpu_release({4242}) is False


def test_memory_release_ignores_other_processes(tmp_path: Path) -> None:
    reader = FakeGpuReader([[_gpu(5.2, (GpuProcess(99, 5 * GIB, "Xorg"),))]])
    assert _controller(tmp_path, reader, timeout=1)._boot.wait_gpu_release({4242}) is True


# -- preflight with a fake GPU --------------------------------------------------------------------
def _preflight(tmp_path: Path, sample: GpuSample):
    recipe = load_recipe(DEFAULT_RECIPE)
    env = dict(recipe.serve.env)
    inp = PreflightInputs(recipe=recipe, env=env, data_dir=tmp_path, runtime=None, runtime_error="daemon down",
                          gpu_reader=FakeGpuReader([[sample]]))
    return {i.id: i for i in run_preflight(inp).items}


def test_preflight_ecc_on_fails_with_card_fix(tmp_path: Path) -> None:
    items = _preflight(tmp_path, _gpu(0.3, ecc=True))
    assert items["ecc"].status == "fail"
    assert "nvidia-smi -e 0" in items["ecc"].fix and "6 GiB" in items["ecc"].detail
    assert items["gpu"].status == "pass"
    assert items["docker"].status == "fail" and "daemon down" in items["docker"].detail


def test_preflight_other_gpu_warns_and_busy_gpu_fails(tmp_path: Path) -> None:
    items = _preflight(tmp_path, _gpu(60, (GpuProcess(1, 60 * GIB, "python"),), cc=(9, 0), total=140))
    assert items["gpu"].status == "warn"  # H200-class: not the card's sm_120
    assert items["gpu_memory"].status == "fail"


def test_preflight_ckpt_pin_against_meta_and_artifacts(tmp_path: Path) -> None:
    meta = tmp_path / "planescache" / "v2" / "abc" / "tp1-rank0"
    meta.mkdir(parents=True)
    (meta / "meta.json").write_text('{"version": 2, "ckpt_id": "something-else"}')
    items = _preflight(tmp_path, _gpu(0.3))
    assert items["ckpt_pin"].status == "fail" and "meta.json" in items["ckpt_pin"].fix
    assert items["artifact:model"].status == "fail"  # required, missing
    assert items["artifact:planescache"].status == "pass"
    recipe = load_recipe(DEFAULT_RECIPE)
    (meta / "meta.json").write_text('{"ckpt_id": "%s"}' % recipe.model.ckpt_id)
    assert _preflight(tmp_path, _gpu(0.3))["ckpt_pin"].status == "pass"


def test_preflight_override_unblocks_only_that_item(tmp_path: Path) -> None:
    recipe = load_recipe(DEFAULT_RECIPE)
    inp = PreflightInputs(recipe=recipe, env=dict(recipe.serve.env), data_dir=tmp_path, runtime=None,
                          gpu_reader=FakeGpuReader([[_gpu(0.3, ecc=True)]]))
    blocking = {i.id for i in run_preflight(inp).blocking()}
    assert "ecc" in blocking
    after = {i.id for i in run_preflight(inp, frozenset({"ecc"})).blocking()}
    assert after == blocking - {"ecc"}


# -- logs -------------------------------------------------------------------------------------------
def test_line_splitter_handles_chunks_and_broken_utf8() -> None:
    sp = LineSplitter()
    assert sp.feed(b"hel") == []
    assert sp.feed(b"lo\nwor") == ["hello"]
    assert sp.feed("ld \u00e9".encode()[:-1]) == []  # half of a UTF-8 sequence waits for the rest
    assert sp.feed(b"\xa9\r\n\xff\n") == ["world \u00e9", "\ufffd"]
    assert sp.flush() == []


def test_logstore_bounds_files_and_keeps_last_runs(tmp_path: Path) -> None:
    store = LogStore(tmp_path, tail=300, max_bytes=2000, keep_runs=3)
    seen: list[LogLine] = []
    unsubscribe = store.add_listener(seen.append)
    for run in range(5):
        store.begin_run(f"c{run}", 1_000_000 + run * 10)
        for i in range(200):
            store.append(LogLine(f"line {i} " + "x" * 20, "stdout" if i % 2 else "stderr"))
    unsubscribe()
    store.append(LogLine("after unsubscribe"))
    assert len(seen) == 1000
    assert len(store.recent(1000)) == 201  # the current run's lines only (tail cleared per run)
    files = sorted(p.name for p in tmp_path.glob("*.log"))
    assert len(files) == 6 and all(f.startswith(("c2-", "c3-", "c4-")) for f in files)
    for p in tmp_path.glob("*.log"):
        assert p.stat().st_size <= 2000 + 200
    assert "size limit reached" in (tmp_path / files[-1]).read_text()


def test_gpu_flag_maps_to_device_request() -> None:
    assert gpu_device_requests('"device=0"')[0]["DeviceIDs"] == ["0"]
    assert gpu_device_requests("all")[0]["Count"] == -1
    assert gpu_device_requests("2")[0]["Count"] == 2
    assert gpu_device_requests("") == []


def test_saved_runs_listed_and_read_without_paths_from_users(tmp_path: Path) -> None:
    store = LogStore(tmp_path)
    store.begin_run("moet-x-quality", 1_000_000)
    store.append(LogLine("out line", "stdout"))
    store.append(LogLine("err line", "stderr"))
    store.end_run()
    [run] = store.runs()
    assert [ln.text for ln in store.read_run(run, ("stderr",))] == ["err line"]
    assert store.read_run("../../etc/passwd") == [] and store.run_path("../x", "stdout") is None
    assert store.run_path(run, "stdout").read_text() == "out line\n"


def test_recipe_pool_line_never_overrides_the_env() -> None:
    env = {"VLLM_MOE_W2": "1", "VLLM_MOE_W2_DELTA_GB": "7"}
    assert expects_pool(env) is True and expects_pool(env, "from_env") is True
    assert expects_pool(env, "never") is False
