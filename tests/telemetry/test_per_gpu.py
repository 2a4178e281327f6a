"""A box of several GPUs (issue 43, docs/telemetry.md "Several GPUs"): the hub scrapes every GPU's engine, the
timeline keeps each GPU's VRAM, utilisation and decode speed, and the plots get a line per GPU."""

from __future__ import annotations

import sqlite3

import pytest

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.config.settings import resolve_settings
from app.backend.telemetry.gpu_sim import FakeGpuReader
from app.backend.telemetry.sampler import TelemetrySampler
from app.backend.telemetry.plotdata import PLOTS, columns, plots_for, wide
from app.backend.telemetry.timeline import TimelineDB, TimelinePoint

from .test_metrics import NEW, _Server


def _gpu(used_gib: float, util: float) -> dict:
    return {"memory_total_gib": 96, "memory_used_gib": used_gib, "name": "Fake RTX", "util_gpu": util}


def test_the_hub_scrapes_every_gpus_engine_and_the_timeline_keeps_each(tmp_path, fake_engine) -> None:
    settings = resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)
    server = _Server()
    gpu1 = {"snap": EngineSnapshot(state=EngineState.READY, profile_id="balanced", base_url=server.url)}
    reader = FakeGpuReader.from_dict({"gpus": [_gpu(93.8, 10), _gpu(91.0, 80), _gpu(0.0, 0)]})
    hub = TelemetrySampler(settings, engine=fake_engine, gpu_reader=reader, persist=False,
                       more_engines={1: lambda: gpu1["snap"], 2: lambda: EngineSnapshot()})
    try:
        assert hub.engine_gpus == [0, 1, 2]
        hub.sample_once()  # the first scrape of GPU 1's engine: no rate yet
        server.body = NEW.format(gen=500.0, prompt=0.0, t1=1, t2=1)
        f = hub.sample_once()
        figures = {e.gpu: e for e in f.per_gpu}
        assert figures[0].state is EngineState.READY and figures[0].profile == "quality"
        assert figures[1].profile == "balanced" and figures[1].decode_tok_s is not None and figures[1].decode_tok_s > 0
        assert figures[2].state is EngineState.STOPPED and figures[2].decode_tok_s is None  # nothing serves there
        p = hub.timeline.latest()
        assert p is not None and p.per_gpu
        plots = plots_for(hub.engine_gpus)
        row = wide([p], plots=plots)[0]
        by_col = dict(zip(columns(plots), row[1:], strict=True))
        assert by_col[("gpus_vram", "GPU 1")] == pytest.approx(91.0)
        assert by_col[("gpus_util", "GPU 1")] == 80
        assert by_col[("gpus_decode", "GPU 1")] == pytest.approx(figures[1].decode_tok_s, abs=0.01)
        assert by_col[("gpus_decode", "GPU 2")] is None
        gpu1["snap"] = EngineSnapshot()  # GPU 1's engine stopped: its decode line has no value (a gap)
        hub.sample_once()
        assert {e.gpu: e.decode_tok_s for e in hub.latest().per_gpu}[1] is None
    finally:
        hub.close()
        server.close()


def test_a_one_gpu_box_has_the_plots_as_before(tmp_path, fake_engine) -> None:
    settings = resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)
    hub = TelemetrySampler(settings, engine=fake_engine, gpu_reader=FakeGpuReader.from_dict({"gpus": [_gpu(1, 0)]}),
                       persist=False)
    try:
        f = hub.sample_once()
        assert f.per_gpu == () and hub.timeline.latest().per_gpu == ""
        assert plots_for(hub.engine_gpus) == PLOTS
    finally:
        hub.close()


def test_a_history_written_before_the_per_gpu_column_opens_and_reads(tmp_path) -> None:
    path = tmp_path / "telemetry.sqlite"
    old = sqlite3.connect(path)  # the table as an older panel made it: no per_gpu column
    old.execute("CREATE TABLE points (ts REAL, profile TEXT, engine_state TEXT, vram_used_gib REAL)")
    old.execute("INSERT INTO points (ts, profile, engine_state, vram_used_gib) VALUES (100, 'quality', 'ready', 90)")
    old.commit()
    old.close()
    db = TimelineDB(path, retention_s=1e12)
    try:
        db.insert([TimelinePoint(ts=101, profile="quality", engine_state="ready", per_gpu="[[0,90.0,5,50.0]]")])
        pts = db.query(0)
        assert [(p.ts, p.per_gpu) for p in pts] == [(100, ""), (101, "[[0,90.0,5,50.0]]")]
        assert pts[0].vram_used_gib == 90
    finally:
        db.close()
