"""Alerts triggered from the SIMULATED engine's modes (pool_disabled, a churny pool), end to end:
sim engine log lines → hub (via an engine-like relay) → alerts; /metrics traffic from the same server."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.config.settings import resolve_settings
from app.backend.simengine.config import SimEngineConfig
from app.backend.simengine.server import SimEngineServer
from app.backend.alerts.rules import status_alerts
from app.backend.telemetry.gpu_sim import FakeGpuReader
from app.backend.telemetry.sampler import TelemetrySampler

from .conftest import FakeEngine

pytestmark = pytest.mark.slow


@pytest.fixture
def sim_hub(tmp_path):
    """Yields start(env, fail) -> (server, hub, engine); everything is stopped afterwards."""
    made: list = []

    def start(env: dict[str, str], fail: str = "", decode: float = 300.0):
        eng = FakeEngine(EngineSnapshot(state=EngineState.STARTING, profile_id="quality"))
        srv = SimEngineServer(SimEngineConfig(port=0, boot_s=0.3, decode_tok_s=decode, fail=fail, env=env),
                              log=eng.emit)
        hub = TelemetrySampler(resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True), engine=eng,
                           gpu_reader=FakeGpuReader(), persist=False)
        made.append((srv, hub))
        srv.start()
        assert srv.wait_ready(20), "sim engine did not become ready"
        eng.set(state=EngineState.READY, base_url=srv.base_url, simulated=True)
        return srv, hub, eng

    try:
        yield start
    finally:
        for srv, hub in made:
            hub.close()
            srv.stop()


def _traffic(base_url: str, tokens: int) -> threading.Thread:
    def go():
        try:
            httpx.post(base_url + "/v1/completions", timeout=60,
                       json={"model": "deepseek-v4-flash", "prompt": "x", "max_tokens": tokens, "ignore_eos": True})
        except httpx.HTTPError:
            pass

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def _poll(hub: TelemetrySampler, pred, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    f = hub.sample_once()
    while not pred(f) and time.monotonic() < deadline:
        time.sleep(0.05)
        f = hub.sample_once()
    return f


def test_pool_disabled_mode_raises_pool_absent(sim_hub) -> None:
    srv, hub, eng = sim_hub({"VLLM_MOE_W2_DELTA_TRACE": "1"}, fail="pool_disabled")
    f = _poll(hub, lambda f: any(a.id == "pool_absent" for a in f.alerts))
    alert = next(a for a in f.alerts if a.id == "pool_absent")
    assert alert.severity == "critical" and "4.96/30" in alert.meaning
    assert f.trace.sizing.disabled
    # the same verdict from `moet-panel engine status` (log lines only)
    st = status_alerts(None, eng.snapshot(), eng.recent_logs(1000))
    assert "pool_absent" in {a.id for a in st}


def test_churny_pool_raises_churn_trap_and_metrics_move(sim_hub) -> None:
    env = {"VLLM_MOE_W2_DELTA_TRACE": "1", "VLLM_MOE_W2_DELTA_TRACE_EVERY": "16",
           "VLLM_MOE_W2_DELTA_GB": "0.1", "VLLM_MOE_W2_DELTA_POLICY": "freq", "VLLM_MOE_W2_DELTA_PROMOTE": "8"}
    srv, hub, eng = sim_hub(env)
    t = _traffic(srv.base_url, 2000)
    f = _poll(hub, lambda f: any(a.id == "churn_trap" for a in f.alerts) and (f.decode_tok_s or 0) > 0)
    t.join(timeout=30)
    assert "churn_trap" in {a.id for a in f.alerts}
    r = f.trace.primary
    assert r.last.slots == 8 and r.replacements_per_s / r.last.slots >= 2.5
    assert f.decode_tok_s > 0 and f.metrics.error == ""


def test_healthy_card_pool_has_coverage_and_no_churn_alert(sim_hub) -> None:
    env = {"VLLM_MOE_W2_DELTA_TRACE": "1", "VLLM_MOE_W2_DELTA_TRACE_EVERY": "16",
           "VLLM_MOE_W2_DELTA_GB": "7", "VLLM_MOE_W2_DELTA_POLICY": "freq", "VLLM_MOE_W2_PROMO_HYST": "8"}
    srv, hub, eng = sim_hub(env, decode=400.0)
    t = _traffic(srv.base_url, 1600)
    f = _poll(hub, lambda f: f.trace.summaries >= 40 and f.trace.primary.replacements_per_s is not None, timeout=30)
    t.join(timeout=30)
    assert f.trace.primary.last.slots == 597 and f.coverage_pct > 0
    assert not {"churn_trap", "pool_absent", "zero_coverage"} & {a.id for a in f.alerts}
