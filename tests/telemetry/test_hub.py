"""TelemetrySampler: one sampler for every reader, log subscription, timeline, SQLite history, alerts."""

from __future__ import annotations

import time

import pytest

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.config.settings import resolve_settings
from app.backend.telemetry.gpu_sim import FakeGpuReader
from app.backend.telemetry.sampler import TelemetrySampler
from app.backend.telemetry.timeline import Timeline, TimelineDB, TimelinePoint

from .conftest import FakeEngine, log_text

GIB = 2**30


@pytest.fixture
def settings(tmp_path):
    return resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)


def _gpu(used_gib: float, **kw) -> dict:
    return {"memory_total_gib": 96, "memory_used_gib": used_gib, "name": "Fake RTX", **kw}


def test_frame_from_fixture_logs_and_fake_gpu(settings, fake_engine) -> None:
    reader = FakeGpuReader.from_dict({"gpus": [_gpu(93.3, memory_reserved_gib=0.5)]})
    hub = TelemetrySampler(settings, engine=fake_engine, gpu_reader=reader, persist=False)
    try:
        for line in log_text("freq_trace1_every64_469slots_top8.log").splitlines():
            fake_engine.emit(line)
        f = hub.sample_once()
        assert f.coverage_pct == 46.5 and f.trace.primary.last.tick == 3968
        assert f.vram_used_gib == pytest.approx(93.3) and f.vram_total_gib == 96  # nvidia-smi's used: reserve apart
        assert f.gpu_error == "" and not f.gpu_simulated and f.host is not None
        p = hub.timeline.latest()
        assert (p.profile, p.engine_state, p.coverage_pct, p.pool_fill, p.pool_slots) == ("quality", "ready", 46.5, 469, 469)
        assert [a.id for a in f.alerts] == []
    finally:
        hub.close()
    assert fake_engine.listener_count == 0  # unsubscribed on close


def test_latest_is_a_cache_reads_do_not_sample(settings, fake_engine) -> None:
    reader = FakeGpuReader.from_dict({"gpus": [_gpu(1)]})
    hub = TelemetrySampler(settings, engine=fake_engine, gpu_reader=reader, persist=False)
    try:
        hub.sample_once()
        for _ in range(500):  # e.g. many open tabs polling every second
            hub.latest()
            hub.series(300)
        assert reader.read_count == 1
    finally:
        hub.close()


def test_background_thread_samples_and_stops(settings) -> None:
    reader = FakeGpuReader.from_dict({"gpus": [_gpu(1)]})
    hub = TelemetrySampler(settings, gpu_reader=reader, persist=False, interval_s=0.05)
    hub.start()
    try:
        deadline = time.monotonic() + 10
        while hub.latest().seq < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hub.latest().seq >= 3
        thread = hub._thread
    finally:
        hub.close()
    assert thread is not None and not thread.is_alive()  # close() joined the sampler: it really stopped
    n = reader.read_count
    hub.latest()  # reading the cache never samples
    assert reader.read_count == n


def test_engine_attached_later_and_recent_logs_replayed(settings) -> None:
    holder: dict = {"engine": None}
    hub = TelemetrySampler(settings, gpu_reader=FakeGpuReader(), persist=False, engine_provider=lambda: holder["engine"])
    try:
        hub.sample_once()
        eng = FakeEngine(EngineSnapshot(state=EngineState.READY, profile_id="quality"))
        for line in log_text("boot_tp1_5.5gib_packstore_trace1_nodump.log").splitlines():
            eng.emit(line)  # printed before the hub subscribed
        holder["engine"] = eng
        f = hub.sample_once()
        assert eng.listener_count == 1 and f.trace.sizing.slots == 469 and f.trace.trace_on
    finally:
        hub.close()


def test_new_boot_resets_trace_state(settings, fake_engine) -> None:
    hub = TelemetrySampler(settings, engine=fake_engine, gpu_reader=FakeGpuReader(), persist=False)
    try:
        for line in log_text("freq_trace1_every64_469slots_top8.log").splitlines():
            fake_engine.emit(line)
        assert hub.sample_once().coverage_pct == 46.5
        fake_engine.set(state=EngineState.STARTING, profile_id="balanced")
        f = hub.sample_once()
        assert f.coverage_pct is None and f.trace.summaries == 0
    finally:
        hub.close()


def test_no_gpu_state_and_gpu_alerts(settings, fake_engine) -> None:
    hub = TelemetrySampler(settings, engine=fake_engine, persist=False,
                       gpu_reader=FakeGpuReader(error="no NVIDIA GPU (libnvidia-ml.so not found)"))
    try:
        f = hub.sample_once()
        assert f.gpus == () and f.gpu_error == "no NVIDIA GPU (libnvidia-ml.so not found)"
        assert f.vram_used_gib is None
    finally:
        hub.close()
    hot = FakeGpuReader.from_dict({"gpus": [_gpu(95.2, throttle_reasons=["hw_thermal"], ecc_current=True)]})
    hub = TelemetrySampler(settings, engine=fake_engine, gpu_reader=hot, persist=False)
    try:
        ids = {a.id for a in hub.sample_once().alerts}
        assert {"vram_full", "throttle_thermal", "ecc_on"} <= ids
    finally:
        hub.close()


def test_timeline_bounded_and_window() -> None:
    tl = Timeline(capacity=100)
    for i in range(1000):
        tl.append(TimelinePoint(ts=float(i)))
    assert len(tl) == 100 and tl.points()[0].ts == 900.0
    assert [p.ts for p in tl.points(since=995.0)] == [995.0, 996.0, 997.0, 998.0, 999.0]


def test_sqlite_history_persists_and_thins(tmp_path) -> None:
    db = TimelineDB(tmp_path / "telemetry.sqlite")
    now = time.time()
    db.insert([TimelinePoint(ts=now - 100 + i, profile="quality", coverage_pct=50.0 + i % 3) for i in range(100)])
    db.close()
    db = TimelineDB(tmp_path / "telemetry.sqlite")  # reopened: history survived
    try:
        pts = db.query(now - 200)
        assert len(pts) == 100 and pts[0].profile == "quality" and pts[-1].coverage_pct in (50.0, 51.0, 52.0)
        assert len(db.query(now - 200, max_points=10)) <= 10
    finally:
        db.close()


def test_hub_writes_history_to_state_dir(settings, fake_engine) -> None:
    hub = TelemetrySampler(settings, engine=fake_engine, gpu_reader=FakeGpuReader.from_dict({"gpus": [_gpu(2)]}))
    try:
        for _ in range(3):
            hub.sample_once()
    finally:
        hub.close()  # flushes the pending batch
    db = TimelineDB(settings.state_dir / "telemetry.sqlite")
    try:
        pts = db.query(time.time() - 60)
        assert len(pts) == 3 and pts[-1].vram_used_gib == pytest.approx(2.0)
    finally:
        db.close()


def test_trace_off_alert_when_traffic_without_ticks(settings, fake_engine) -> None:
    from app.backend.telemetry.metrics import MetricsSample

    class Scraper:
        def scrape(self, url):
            return MetricsSample(ts=time.time(), decode_tok_s=48.9)

        def reset(self):
            pass

        def close(self):
            pass

    fake_engine.set(base_url="http://127.0.0.1:1")
    hub = TelemetrySampler(settings, engine=fake_engine, gpu_reader=FakeGpuReader(), persist=False,
                       scraper=Scraper(), interval_s=30.0)
    try:
        assert "trace_off" not in {a.id for a in hub.sample_once().alerts}
        for _ in range(3):
            f = hub.sample_once()
        alert = next(a for a in f.alerts if a.id == "trace_off")
        assert "VLLM_MOE_W2_DELTA_TRACE=1" in alert.action and "restart" in alert.action
        fake_engine.emit(log_text("freq_trace1_every64_469slots_top8.log").splitlines()[2])  # a tick line arrives
        assert "trace_off" not in {a.id for a in hub.sample_once().alerts}
    finally:
        hub.close()


def test_idle_engine_churn_drops_to_zero_coverage_kept(settings, fake_engine) -> None:
    import dataclasses

    hub = TelemetrySampler(settings, engine=fake_engine, gpu_reader=FakeGpuReader(), persist=False)
    try:
        for line in log_text("freq_trace1_every64_469slots_top8.log").splitlines():
            hub.ingest(line)  # LogLine.ts = now: a live-like stream (rates need ≥ 2 s: none yet)
        f = hub.sample_once()
        assert f.pool_idle_s is None and f.coverage_pct == 46.5
        later = dataclasses.replace(f, ts=f.ts + 30)  # 30 s without a tick line: the engine idles
        assert later.pool_idle_s == pytest.approx(30, abs=1) and later.churn_per_s == 0.0
        assert later.coverage_pct == 46.5  # last measured coverage stays valid
    finally:
        hub.close()


def test_hub_marks_the_engines_gpu_processes(settings, fake_engine) -> None:
    # The readers return raw samples (item 4 of issue 34): the hub, which has the engine, marks its processes.
    reader = FakeGpuReader.from_dict({"gpus": [_gpu(90, processes=[{"pid": 419, "used_bytes": 2**30},
                                                                    {"pid": 77, "used_bytes": None}])]})
    fake_engine.pids = {419}
    fake_engine.set(container_name="moet-ds4-quality")
    hub = TelemetrySampler(settings, engine=fake_engine, gpu_reader=reader, persist=False)
    try:
        procs = hub.sample_once().gpus[0].processes
        assert [(p.pid, p.container) for p in procs] == [(419, "moet-ds4-quality"), (77, "")]
    finally:
        hub.close()


def _until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_engine_change_shows_at_once_without_a_tick(settings, fake_engine) -> None:
    """The hub follows the engine's change events: with a 60 s tick, a stop still clears the pool alert and
    marks the state band at once, from the last GPU reading (no new sample: those stay on the tick)."""
    reader = FakeGpuReader.from_dict({"gpus": [_gpu(40)]})
    hub = TelemetrySampler(settings, engine=fake_engine, gpu_reader=reader, persist=False, interval_s=60)
    try:
        for line in log_text("disabled_auto_0slots_trace1_every64.log").splitlines():
            fake_engine.emit(line)
        hub.start()
        _until(lambda: hub.latest().seq >= 1, 10, "the first tick")
        assert "pool_absent" in [a.id for a in hub.latest().alerts]
        assert hub.timeline.latest().engine_state == "ready"
        fake_engine.set(phase="still ready")  # a change that moves no band: a frame, no timeline point
        _until(lambda: hub.latest().engine.phase == "still ready", 5, "the phase change")
        assert len(hub.timeline) == 1
        fake_engine.set(state=EngineState.STOPPED)
        _until(lambda: hub.latest().engine.state is EngineState.STOPPED, 5, "the stop, before the next tick")
        f = hub.latest()
        assert [a.id for a in f.alerts] == []  # no trace alerts for a stopped engine
        assert f.vram_used_gib == pytest.approx(40)  # the last reading, carried
        assert hub.timeline.latest().engine_state == "stopped" and len(hub.timeline) == 2
        assert reader.read_count == 1  # the GPU was read on the one tick only
    finally:
        hub.close()
    assert fake_engine.events.subscribers == 0  # the watch closed with the hub
    assert fake_engine.listener_count == 0


def test_engine_change_after_close_wakes_nothing(settings, fake_engine) -> None:
    hub = TelemetrySampler(settings, engine=fake_engine, gpu_reader=FakeGpuReader(), persist=False, interval_s=60)
    hub.start()
    _until(lambda: hub.latest().seq >= 1, 10, "the first tick")
    hub.close()
    seq = hub.latest().seq
    fake_engine.set(state=EngineState.STOPPED)
    assert hub.latest().seq == seq and fake_engine.events.subscribers == 0
