"""The generation canary (issue 32): a hung engine that answers /health 200 with nothing running is caught
(the SIMULATED `hang_after_ready` mode); a healthy idle engine passes; with the policy on, the hung engine is
restarted and, hanging again, given up at the cap. Real Docker, the SIMULATED image."""

from __future__ import annotations

import time

from app.backend.contracts import EngineState
from tests.engine.conftest import fail_profile
from tests.polling import wait_for
from tests.engine.test_multi_actor import _settings_with_image

CANARY = dict(supervise=True, resync_s=0.5, canary_interval_s=1.0, canary_timeout_s=1.0, restart_backoff_s=0.3)


def test_healthy_idle_engine_passes_the_canary(make_controller, sim_settings) -> None:
    ctl = make_controller(**CANARY)
    assert ctl.start("quality").wait(90)
    wait_for(lambda: ctl.snapshot().canary.startswith("ok"), 20, "a canary to pass")
    snap = ctl.snapshot()
    assert snap.state is EngineState.READY and snap.stalls_total == 0
    # the reading /metrics exports comes from the snapshot (one source)
    assert snap.canary_ok is True and snap.canary_at > 0 and snap.canary_latency_s > 0


def test_hang_after_ready_is_detected_by_the_canary(make_controller, sim_settings, sim_image) -> None:
    settings = _settings_with_image(sim_settings, sim_image)
    hang = fail_profile(settings.recipe, "hang_after_ready")
    ctl = make_controller(settings, profiles=[hang], restart_policy_fn=lambda: "never", **CANARY)
    assert ctl.start(hang.id).wait(90)
    ready_at = time.monotonic()
    assert ctl.snapshot().state is EngineState.READY  # /health 200 and the model listed: ready by the gate
    wait_for(lambda: ctl.snapshot().state is EngineState.STALLED, 30, "the canary to judge it stalled")
    detect_s = time.monotonic() - ready_at
    snap = ctl.snapshot()
    assert snap.diagnosis is not None and "canary" in snap.diagnosis.title
    assert snap.canary.startswith("failed 2 of 2") and snap.restarts_total == 0  # policy never: left as is
    assert snap.canary_ok is False and snap.canary_failures_total >= 2
    print(f"hang detected {detect_s:.1f} s after ready (interval 1 s, timeout 1 s)")


def test_hung_engine_is_restarted_then_given_up_with_the_policy_on(make_controller, sim_settings, sim_image) -> None:
    settings = _settings_with_image(sim_settings, sim_image)
    hang = fail_profile(settings.recipe, "hang_after_ready")
    ctl = make_controller(settings, profiles=[hang], restart_max_tries=1, **CANARY)
    assert ctl.start(hang.id).wait(90)
    wait_for(lambda: ctl.snapshot().restarts_total == 1, 40, "the stalled engine to be restarted")
    wait_for(lambda: ctl.snapshot().gave_up, 60, "the second hang to reach the cap")
    snap = ctl.snapshot()
    assert snap.state is EngineState.STALLED and "gave up after 1 tries" in snap.message
    assert snap.stalls_total >= 1 and snap.restarts_total == 1
