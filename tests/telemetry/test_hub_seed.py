"""A run already serving when the hub first sees it (panel restart): the pool figures come from its log tail
(hub.SEED_LINES lines), not blank until the next trace tick (issue 29)."""

from __future__ import annotations

import pytest

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.config.settings import resolve_settings
from app.backend.telemetry.gpu_sim import FakeGpuReader
from app.backend.telemetry.sampler import SEED_LINES, TelemetrySampler

from .conftest import FakeEngine, log_text

TRACE_LOG = "freq_trace1_every64_469slots_top8.log"  # its last tick: 46.5% coverage
ACCESS = 'INFO:     127.0.0.1:40000 - "GET /metrics HTTP/1.1" 200 OK'


class FakeRuntime:
    """`tail_logs` of a run: the trace fixture, then `idle` access-log lines (an idle engine scraped for minutes)."""

    def __init__(self, idle: int) -> None:
        self.lines = [("stdout", t) for t in log_text(TRACE_LOG).splitlines()] + [("stdout", ACCESS)] * idle
        self.calls: list[tuple[str, int]] = []

    def tail_logs(self, ident: str, lines: int) -> list[tuple[str, str]]:
        self.calls.append((ident, lines))
        return self.lines[-lines:]


class AdoptedEngine(FakeEngine):
    """What the controller hands on after adopting a running engine: only its last 300 lines."""

    def __init__(self, snapshot: EngineSnapshot, runtime: FakeRuntime) -> None:
        super().__init__(snapshot)
        self.runtime = runtime
        for _, text in runtime.lines[-300:]:
            self.emit(text)


@pytest.fixture
def settings(tmp_path):
    return resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)


def _hub(settings, engine) -> TelemetrySampler:
    return TelemetrySampler(settings, engine=engine, gpu_reader=FakeGpuReader(), persist=False)


def test_restart_after_a_long_idle_seeds_coverage_from_the_tail(settings) -> None:
    rt = FakeRuntime(idle=3000)  # ~25 min of /metrics reads after the last tick: beyond the adopted 300 lines
    eng = AdoptedEngine(EngineSnapshot(state=EngineState.READY, profile_id="quality", container_id="c1"), rt)
    hub = _hub(settings, eng)
    try:
        f = hub.sample_once()
        assert f.coverage_pct == 46.5 and f.trace.primary.last.tick == 3968
        assert f.churn_per_s is None  # one burst of old lines: no rate from it
        assert rt.calls == [("c1", SEED_LINES)]
        hub.sample_once()
        assert len(rt.calls) == 1  # once per run
        eng.emit(ACCESS)  # live lines go on from there
        assert hub.sample_once().coverage_pct == 46.5
    finally:
        hub.close()


def test_without_the_tail_the_idle_restart_starts_blank(settings) -> None:
    """What the seed fixes: the adopted 300 lines hold no tick summary."""
    eng = AdoptedEngine(EngineSnapshot(state=EngineState.READY, profile_id="quality", container_id="c1"),
                        FakeRuntime(idle=3000))
    del eng.runtime
    hub = _hub(settings, eng)
    try:
        assert hub.sample_once().coverage_pct is None
    finally:
        hub.close()


def test_a_boot_the_hub_watched_is_not_read_again(settings) -> None:
    rt = FakeRuntime(idle=0)
    eng = FakeEngine(EngineSnapshot(state=EngineState.STARTING, profile_id="quality", container_id="c2"))
    eng.runtime = rt
    hub = _hub(settings, eng)
    try:
        hub.sample_once()
        for line in log_text(TRACE_LOG).splitlines():
            eng.emit(line)
        eng.set(state=EngineState.READY)
        assert hub.sample_once().coverage_pct == 46.5
        assert rt.calls == []  # its lines came live: a tail would count them twice
    finally:
        hub.close()
