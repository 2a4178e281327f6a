"""The drift alert on the SIMULATED engine's degraded mode (MOET_SIM_DEGRADE), end to end over /metrics."""

from __future__ import annotations

import pytest

import re
import threading
import time

from app.backend.selftest.drift import DriftReading, DriftWatch
from app.backend.alerts.rules import AlertInputs, decode_drift, evaluate
from app.backend.contracts import GpuSample
from app.backend.telemetry.metrics import MetricsScraper
from tests.selftest.test_sim_selftest_support import post


def _watch_during_stream(sim, watch: DriftWatch, seconds: float) -> list[DriftReading | None]:
    body = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 100000, "ignore_eos": True}

    def stream() -> None:
        try:
            post(sim.base_url + "/v1/chat/completions", body, timeout=30)
        except OSError:
            pass  # the sim is stopped mid-stream below: that is how the stream ends

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    scraper, readings = MetricsScraper(timeout_s=1.0), []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            m = scraper.scrape(sim.base_url)
            readings.append(watch.update(time.time(), "quality", m.decode_tok_s, m.running))
            time.sleep(0.5)  # the hub's tick interval, scaled down
    finally:
        scraper.close()
        sim.stop()  # ends the stream
        t.join(10)
    return readings


@pytest.mark.slow  # starts a panel or an engine (the quick tier leaves it to the full run)
def test_degraded_engine_raises_the_drift_alert(make_sim) -> None:
    sim = make_sim(decode_tok_s=100.0, env={"MOET_SIM_DEGRADE": "0.6", "MOET_SIM_DEGRADE_AFTER_S": "0"})
    watch = DriftWatch(lambda pid: (100.0, "the card"), window_s=2.0)
    readings = [r for r in _watch_during_stream(sim, watch, 5.0) if r is not None]
    assert readings and readings[-1].drifting, readings
    assert 50 < readings[-1].live_tok_s < 70
    hot = GpuSample(0, "u", "g", None, 1, 0, 0, throttle_reasons=("sw_thermal",))
    alerts = evaluate(AlertInputs(drift=readings[-1], gpus=[hot]))
    drift = [a for a in alerts if a.id == "decode_drift"]
    assert drift and re.search(r"(3[5-9]|4[0-5])% below the baseline of profile quality \(the card\)", drift[0].meaning)
    assert "clocks held down (sw_thermal)" in drift[0].meaning


@pytest.mark.slow  # starts a panel or an engine (the quick tier leaves it to the full run)
def test_healthy_engine_raises_none(make_sim) -> None:
    sim = make_sim(decode_tok_s=100.0)
    watch = DriftWatch(lambda pid: (100.0, "the card"), window_s=2.0)
    assert [r for r in _watch_during_stream(sim, watch, 4.0) if r is not None] == []


def _reading(r: DriftReading | None) -> DriftReading:
    assert r is not None
    return r


def test_short_dips_and_idle_reset_the_window() -> None:
    w = DriftWatch(lambda pid: (50.0, "the card"), window_s=30)
    assert w.update(0, "quality", 30.0, 1) is not None
    assert not _reading(w.update(10, "quality", 30.0, 1)).drifting
    assert w.update(20, "quality", 49.0, 1) is None  # back to normal: the window restarts
    assert _reading(w.update(25, "quality", 30.0, 1)).below_s == 0
    assert w.update(40, "quality", 30.0, 2) is None  # two streams: not a single-stream figure
    assert decode_drift(AlertInputs(drift=w.update(50, "quality", 30.0, 1))) is None
    assert _reading(w.update(81, "quality", 30.0, 1)).drifting
