"""`moet-panel engine status` and the panel header read the pool trace from the same place: the running
engine's log (issue 29: status said "No pool trace … start with VLLM_MOE_W2_DELTA_TRACE=1" while the header
showed 53.9% coverage). Real Docker, the SIMULATED engine, the real `openai` client; the CLI in a child
process as a user runs it."""

from __future__ import annotations

import json

import httpx

from app.backend.contracts import EngineState
from app.backend.engine.runtime.client import own_http
from app.backend.telemetry.sampler import TelemetrySampler
from tests.conftest import engine_openai
from tests.polling import wait_for
from tests.engine.test_multi_actor import _settings_with_image, cli


class _NoGpu:
    available, error, simulated = False, "no GPU in this test", False

    def read(self) -> list:
        return []

    def close(self) -> None:
        pass


def test_status_shows_the_coverage_the_header_shows(make_controller, sim_settings, sim_image, recipe_file) -> None:
    st = _settings_with_image(sim_settings, sim_image)
    ctl = make_controller(st)
    assert ctl.start("balanced").wait(60) and ctl.snapshot().state is EngineState.READY
    hub = TelemetrySampler(st, engine=ctl, gpu_reader=_NoGpu(), persist=False)  # the header's source
    try:
        base = ctl.snapshot().base_url
        client = engine_openai(base, api_key="x", timeout=30)  # over the engine's socket (issue 40)

        def served_until_a_tick() -> bool:
            client.chat.completions.create(model=ctl.snapshot().served_name, max_tokens=64,
                                           messages=[{"role": "user", "content": "Tell me about pools."}])
            return hub.sample_once().coverage_pct is not None

        wait_for(served_until_a_tick, 90, "a [delta] tick summary after traffic")
        # An engine watched by a panel for a while: health checks push the boot and tick lines far up the log.
        h, root = own_http(base, httpx.Timeout(10.0))
        with h:
            for _ in range(2200):
                h.get(root + "/health")
        header = hub.sample_once().coverage_pct
        assert header is not None

        r = cli(recipe_file, st.data_dir, "engine", "status", "--json")
        out = json.loads(r.stdout)
        assert out["engine"]["state"] == "ready", r.stdout + r.stderr
        assert [a["id"] for a in out["alerts"] if a["id"].startswith("trace")] == [], out["alerts"]
        assert out["trace"]["coverage_pct"] == header, out["trace"]
        r = cli(recipe_file, st.data_dir, "engine", "status")
        assert "No pool trace" not in r.stdout, r.stdout
        assert f"pool coverage: {header:g}% of tokens" in r.stdout, r.stdout
    finally:
        hub.close()
