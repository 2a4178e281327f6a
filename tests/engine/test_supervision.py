"""Keeps serving when nobody watches (issue 32): the desired state survives the panel, the supervisor brings
back what should run, restarts crashes with backoff and a cap, never retries what a restart cannot heal,
and respects a person's outside stop. Real Docker, the SIMULATED image; every wait polls with a deadline."""

from __future__ import annotations

import time
from pathlib import Path

from app.backend.engine.supervision.desired import DesiredStore
from app.backend.contracts import EngineState
from tests.engine.conftest import fail_profile, panel_containers
from tests.polling import wait_for
from tests.engine.test_multi_actor import _settings_with_image, cli

SUP = dict(supervise=True, resync_s=0.5, restart_backoff_s=0.3)


def _ready(ctl, profile: str = "quality") -> bool:
    s = ctl.snapshot()
    return s.state is EngineState.READY and s.profile_id == profile


def test_reboot_brings_back_what_should_run_with_no_click(make_controller, docker_client, sim_settings, sim_image,
                                                         recipe_file: Path) -> None:
    settings = _settings_with_image(sim_settings, sim_image)
    a = make_controller(settings, **SUP)
    assert a.start("quality").wait(90)
    assert _ready(a) and DesiredStore(settings.state_dir).read().key == "serve:quality"
    a.close()  # the panel stops (the engine outlives it)
    (c,) = panel_containers(docker_client, settings.recipe.id)
    c.kill()  # the power goes: SIGKILL, no clean shutdown
    wait_for(lambda: panel_containers(docker_client, settings.recipe.id) == [], 20, "the engine to be down")
    boot = time.time() + 1.0  # the host came back after the engine died
    b = make_controller(settings, boot_time_fn=lambda: boot, **SUP)  # the panel starts on boot
    sub = b.subscribe()  # the supervisor's first pass comes one resync (0.5 s) after construction
    wait_for(lambda: _ready(b), 90, "the engine back and ready with no click")
    assert any("stopped by the host's reboot" in e.after.message for e in sub.drain())
    snap = b.snapshot()
    assert snap.restarts_total == 1 and snap.desired == "serve:quality"
    assert len(panel_containers(docker_client, settings.recipe.id)) == 1
    out = cli(recipe_file, settings.data_dir, "engine", "status")
    assert out.returncode == 0, out.stdout + out.stderr


def test_crash_is_restarted_with_backoff_then_given_up_at_the_cap(make_controller, docker_client, sim_settings) -> None:
    ctl = make_controller(restart_max_tries=2, **SUP)
    assert ctl.start("quality").wait(90) and _ready(ctl)
    for n in (1, 2):
        (c,) = panel_containers(docker_client, sim_settings.recipe.id)
        old = c.id
        c.kill()
        wait_for(lambda n=n: f"try {n} of 2" in ctl.snapshot().message or ctl.snapshot().restarts_total >= n, 20,
                   f"restart try {n} announced")
        wait_for(lambda old=old: _ready(ctl) and ctl.snapshot().container_id != old, 90,
                   f"ready again after crash {n}")
        assert ctl.snapshot().restarts_total == n
    (c,) = panel_containers(docker_client, sim_settings.recipe.id)
    c.kill()
    wait_for(lambda: ctl.snapshot().gave_up, 30, "the supervisor to give up at the cap")
    snap = ctl.snapshot()
    assert snap.state is EngineState.FAILED and "gave up after 2 tries" in snap.message
    assert snap.diagnosis is not None and snap.diagnosis.reason == "killed"
    assert snap.restarts_total == 2 and panel_containers(docker_client, sim_settings.recipe.id) == []
    assert ctl.start("quality").wait(90) and _ready(ctl)  # a person's start clears the give-up
    assert not ctl.snapshot().gave_up


def test_non_healing_failure_is_not_retried(make_controller, docker_client, sim_settings) -> None:
    oom = fail_profile(sim_settings.recipe, "oom_at_load")
    ctl = make_controller(profiles=[oom], **SUP)
    ctl.start(oom.id).wait(90)
    wait_for(lambda: ctl.snapshot().gave_up, 20, "the supervisor to decide")
    snap = ctl.snapshot()
    assert snap.diagnosis is not None and snap.diagnosis.reason == "cuda_oom_at_load"
    assert "not retried" in snap.message and snap.restarts_total == 0
    assert panel_containers(docker_client, sim_settings.recipe.id) == []  # nothing started again


def test_outside_clean_stop_is_respected_but_a_reboot_stop_is_not(make_controller, docker_client, sim_settings,
                                                                  sim_image, recipe_file: Path) -> None:
    settings = _settings_with_image(sim_settings, sim_image)
    ctl = make_controller(settings, **SUP)
    assert ctl.start("quality").wait(90) and _ready(ctl)
    (c,) = panel_containers(docker_client, settings.recipe.id)
    c.stop(timeout=10)  # a person's `docker stop` while the host is up
    wait_for(lambda: ctl.snapshot().desired == "stopped", 20, "desired to become stopped")
    assert DesiredStore(settings.state_dir).read().kind == "stopped"
    assert ctl.snapshot().state is EngineState.STOPPED and ctl.snapshot().restarts_total == 0
    assert panel_containers(docker_client, settings.recipe.id) == []
    out = cli(recipe_file, settings.data_dir, "engine", "status")
    assert out.returncode == 4, out.stdout + out.stderr
    ctl.close()
    # The same clean stop, but the host rebooted after it (the container's run ended before this boot):
    DesiredStore(settings.state_dir).write("serve", "quality", "panel")
    boot = time.time() + 1.0
    b = make_controller(settings, boot_time_fn=lambda: boot, **SUP)
    wait_for(lambda: _ready(b), 90, "the engine brought back after the reboot")
    assert b.snapshot().desired == "serve:quality"
