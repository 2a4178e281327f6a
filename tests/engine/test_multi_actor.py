"""One truth about the engine (issue 11): several observers and writers on one data dir, real Docker,
the simulated-engine image. Every wait polls with a deadline; nothing sleeps to synchronise."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import pytest

from app.backend import oplog
from app.backend.engine.controller import EngineController
from app.backend.engine.lifecycle.oplock import EngineLock, LockHeld
from app.backend.contracts import EngineSnapshot, EngineState
from tests.engine.conftest import TEST_LABEL, panel_containers
from tests.polling import wait_for

CONVERGE_S = 2.0  # every observer shows Docker's truth within 2 s (issue 11); bench/engine_soak measures the p95
REPO = Path(__file__).resolve().parents[2]


def cli(recipe_file: Path, data_dir: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MOET_SIM_BOOT_S": "1", "MOET_PANEL_GPU": "none"}
    return subprocess.run([sys.executable, "-m", "app.cli.main", *args, "--recipe", str(recipe_file),
                           "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=REPO)


def converge(panels: tuple[EngineController, ...], pred: Callable[[EngineSnapshot], bool], what: str) -> None:
    """Each panel shows `pred` within CONVERGE_S of the outside change (one deadline for all of them)."""
    deadline = time.monotonic() + CONVERGE_S
    for ctl in panels:
        wait_for(lambda c=ctl: pred(c.snapshot()), max(0.0, deadline - time.monotonic()), what)


def _settings_with_image(sim_settings, image: str):
    from dataclasses import replace

    eng = sim_settings.recipe.engine.model_copy(update={"image": image})
    return replace(sim_settings, recipe=sim_settings.recipe.model_copy(update={"engine": eng}))


def test_two_panels_and_outside_actors_converge_on_docker(make_controller, docker_client, sim_settings, sim_image,
                                                          recipe_file) -> None:
    st = _settings_with_image(sim_settings, sim_image)
    a, b = make_controller(st), make_controller(st)
    assert a.start("balanced").wait(60) and a.snapshot().state is EngineState.READY
    # B adopts A's engine with the profile from its labels; nobody starts a second one.
    converge((b,), lambda s: s.state is EngineState.READY and s.profile_id == "balanced", "B adopts")
    assert len(panel_containers(docker_client, st.recipe.id)) == 1

    # The CLI (another process) stops and starts another profile: both panels follow.
    r = cli(recipe_file, st.data_dir, "engine", "stop")
    assert r.returncode == 0, r.stdout + r.stderr
    converge((a, b), lambda s: s.state is EngineState.STOPPED, "stopped seen by every panel")
    r = cli(recipe_file, st.data_dir, "engine", "start", "--profile", "speed", "--demo")  # option after the action
    assert r.returncode == 0, r.stdout + r.stderr
    converge((a, b), lambda s: s.state is EngineState.READY and s.profile_id == "speed", "speed adopted")
    assert len(panel_containers(docker_client, st.recipe.id)) == 1
    # the CLI's decisions reach the operator's log (`logs --panel`), not its user's stderr
    cli_lines = [ln for ln in oplog.read_lines(st.state_dir, 0) if "who=cli" in ln]
    assert any("action=stop" in ln for ln in cli_lines) and any("action=start" in ln for ln in cli_lines), cli_lines
    assert "ts=" not in r.stderr, r.stderr
    # The socket preflight knows the listener is the panel's own container, whoever started it (issue 40).
    sock = next(i for i in a.preflight("speed").items if i.id == "socket")
    assert sock.status == "pass" and "this panel's engine" in sock.detail and "700" in sock.detail

    # docker stop from outside: a neutral stop, not a red failure.
    docker_client.containers.get(a.snapshot().container_id).stop(timeout=5)
    converge((a, b), lambda s: s.state is EngineState.STOPPED, "outside docker stop")
    for ctl in (a, b):
        assert ctl.snapshot().diagnosis is not None and ctl.snapshot().diagnosis.reason == "stopped_outside_panel"

    # docker kill: both panels show killed (SIGKILL, exit 137) with the host-OOM how-to.
    assert b.start("balanced").wait(60) and b.snapshot().state is EngineState.READY
    converge((a,), lambda s: s.state is EngineState.READY, "A adopts B's start")
    docker_client.containers.get(b.snapshot().container_id).kill()
    converge((a, b), lambda s: s.state is EngineState.FAILED, "outside docker kill")
    for ctl in (a, b):
        d = ctl.snapshot().diagnosis
        assert d is not None and d.title == "killed (SIGKILL, exit 137)" and "journalctl -k" in d.fix

    # replace: rm -f and a fresh start from the CLI.
    r = cli(recipe_file, st.data_dir, "--demo", "engine", "start", "--profile", "quality")
    assert r.returncode == 0, r.stdout + r.stderr
    new_id = panel_containers(docker_client, st.recipe.id)[0].id
    converge((a, b), lambda s: s.container_id == new_id and s.state is EngineState.READY, "replacement adopted")
    docker_client.containers.get(new_id).remove(force=True)
    converge((a, b), lambda s: s.state is EngineState.STOPPED, "rm -f seen")
    assert not panel_containers(docker_client, st.recipe.id, running_only=False)


def test_second_writer_is_refused_naming_the_holder(make_controller, docker_client, sim_settings, sim_image, recipe_file) -> None:
    st = _settings_with_image(sim_settings, sim_image)
    slow = {"MOET_SIM_BOOT_S": "90"}  # long enough for two CLI processes to meet the held lock
    a = make_controller(st, extra_env=slow)
    b = make_controller(st)
    t = a.start("quality")
    assert t.accepted
    wait_for(lambda: a.lock_holder() is not None, 5, "A holds the lock")
    # B watches A's boot (a watch-only step, no lock): its refusal still names the writer, not its own watch
    wait_for(lambda: b.snapshot().state is EngineState.STARTING and b.busy() is not None, 30, "B watches A's boot")
    refused = b.switch("speed")
    assert not refused.accepted and f"panel pid {os.getpid()}" in refused.message and "start to quality" in refused.message
    r = cli(recipe_file, st.data_dir, "engine", "stop")
    assert r.returncode == 2 and "panel pid" in r.stderr and "start to quality" in r.stderr
    # read-only views keep working while the lock is held
    r = cli(recipe_file, st.data_dir, "engine", "status", "--json")
    assert r.returncode in (0, 5), r.stdout + r.stderr
    assert json.loads(r.stdout)["lock"]["operation"] == "start"
    # the refused writers did not disturb the running operation: still booting, one container
    assert not t.done and a.snapshot().state is EngineState.STARTING and b.snapshot().state is EngineState.STARTING
    assert len(panel_containers(docker_client, st.recipe.id)) == 1
    stop = a.stop()  # the holder itself may stop its own boot
    assert stop.wait(60) and stop.ok, stop.message
    wait_for(lambda: a.lock_holder() is None, 5, "lock released")


def test_a_holder_killed_with_sigkill_releases_the_lock(tmp_path: Path) -> None:
    state = tmp_path / "state"
    code = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from app.backend.engine.lifecycle.oplock import EngineLock
        EngineLock({str(state)!r}).acquire("CLI", "switch", "speed")
        print("held", flush=True)
        time.sleep(600)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "held"
        lock = EngineLock(state)
        with pytest.raises(LockHeld) as info:
            lock.acquire("panel", "start")
        assert info.value.holder is not None and info.value.holder.pid == child.pid
        assert f"CLI pid {child.pid} (switch to speed" in str(info.value)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        assert lock.holder() is None  # stale text in the file is not a holder
        lock.acquire("panel", "start")
        lock.release()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


@pytest.mark.parametrize(("mode", "reason", "state"), [
    ("oom_at_load", "cuda_oom_at_load", "failed"),
    ("host_oom", "host_oom_kill", "failed"),
    ("crash_mid_generation", "", "failed"),
    ("boot_guard", "boot_guard", "failed"),
    ("sigkill", "killed", "failed"),
    ("clean_stop", "stopped_outside_panel", "stopped"),
])
def test_fresh_process_classifies_an_exited_container(mode, reason, state, docker_client, sim_settings, sim_image,
                                                      recipe_file) -> None:
    """The container exits while no panel watches; `engine status` in a new process explains it."""
    from app.backend.recipe.command import build_run_spec

    st = _settings_with_image(sim_settings, sim_image)
    env = {"MOET_SIM_BOOT_S": "1", **({"MOET_SIM_FAIL": mode} if mode in ("oom_at_load", "host_oom",
                                                                          "crash_mid_generation", "boot_guard") else {})}
    spec = build_run_spec(st.recipe, "quality", str(st.data_dir), extra_env=env)
    from app.backend.engine.runtime.docker import DockerRuntime

    rt = DockerRuntime(docker_client)
    inst = rt.run(spec, dict(TEST_LABEL))
    try:
        if mode in ("sigkill", "clean_stop", "crash_mid_generation"):
            from app.backend.engine.runtime.client import base_url
            from app.backend.engine.runtime.readiness import probe

            url = base_url(st.recipe, st.data_dir)
            wait_for(lambda: probe(url, st.recipe.model.served_name).models_ok, 30, "engine ready")
            if mode == "sigkill":
                docker_client.containers.get(inst.id).kill()
            elif mode == "clean_stop":
                docker_client.containers.get(inst.id).stop(timeout=5)
            else:
                import httpx

                from app.backend.engine.runtime.client import own_http

                http, root = own_http(url, httpx.Timeout(20.0))  # over the engine's socket (issue 40)
                with http, pytest.raises(httpx.HTTPError):
                    http.post(f"{root}/v1/chat/completions", json={
                        "model": st.recipe.model.served_name, "max_tokens": 200,
                        "messages": [{"role": "user", "content": "hi"}]}).raise_for_status()
        wait_for(lambda: not (rt.get(inst.id) and rt.get(inst.id).running), 60, "the engine exits")
        r = cli(recipe_file, st.data_dir, "engine", "status", "--json")
        out = json.loads(r.stdout)
        assert out["engine"]["state"] == state, r.stdout
        assert r.returncode == (1 if state == "failed" else 4)
        d = out["engine"]["diagnosis"]
        if reason:
            assert d["reason"] == reason, d
        else:
            assert d["reason"] not in ("stopped_outside_panel", "killed"), d
        if mode == "sigkill":
            assert d["title"] == "killed (SIGKILL, exit 137)" and "64 GB" in d["explanation"] + d["fix"]
    finally:
        rt.remove(inst.id)


def test_stalled_engine_is_seen_with_evidence(make_controller, docker_client, sim_settings, sim_image) -> None:
    import threading

    import httpx

    st = _settings_with_image(sim_settings, sim_image)
    ctl = make_controller(st, extra_env={"MOET_SIM_FAIL": "hang_mid_generation"}, stall_after_s=2.0,
                          liveness_poll_s=0.25)
    assert ctl.start("quality").wait(60) and ctl.snapshot().state is EngineState.READY
    from app.backend.engine.runtime.client import own_http

    http, url = own_http(ctl.snapshot().base_url, httpx.Timeout(30.0))  # over the engine's socket (issue 40)

    def ask() -> None:
        try:
            http.post(f"{url}/v1/chat/completions", json={
                "model": st.recipe.model.served_name, "max_tokens": 500, "stream": True,
                "messages": [{"role": "user", "content": "hi"}]})
        except httpx.HTTPError:
            pass

    threading.Thread(target=ask, daemon=True).start()
    wait_for(lambda: ctl.snapshot().state is EngineState.STALLED, 20, "stalled")
    assert http.get(f"{url}/health", timeout=5).status_code == 200  # /health still says fine
    d = ctl.snapshot().diagnosis
    assert d is not None and d.reason == "stalled" and any("running requests: 1" in e for e in d.evidence)
    stop = ctl.stop()
    assert stop.wait(30) and stop.ok and ctl.snapshot().state is EngineState.STOPPED


def test_stalled_engine_restarts_on_the_same_profile_when_asked(make_controller, sim_settings, sim_image) -> None:
    import threading

    import httpx

    st = _settings_with_image(sim_settings, sim_image)
    ctl = make_controller(st, extra_env={"MOET_SIM_FAIL": "hang_mid_generation"}, stall_after_s=2.0,
                          liveness_poll_s=0.25, restart_on_stall=True)
    assert ctl.start("balanced").wait(60)
    first = ctl.snapshot().container_id
    from app.backend.engine.runtime.client import own_http

    http, url = own_http(ctl.snapshot().base_url, httpx.Timeout(30.0))  # over the engine's socket (issue 40)

    def ask() -> None:
        try:
            http.post(f"{url}/v1/completions", json={
                "model": st.recipe.model.served_name, "prompt": "x", "max_tokens": 300})
        except httpx.HTTPError:  # the restart cuts the hung request
            pass

    threading.Thread(target=ask, daemon=True).start()

    def restarted_with_the_stall_shown() -> bool:
        # the stall's diagnosis is noted just after the new run is ready (one event later): poll for both
        snap = ctl.snapshot()
        return (snap.state is EngineState.READY and snap.container_id not in ("", first)
                and snap.diagnosis is not None)

    wait_for(restarted_with_the_stall_shown, 60, "restarted, with the stall's diagnosis shown")
    snap = ctl.snapshot()
    assert snap.profile_id == "balanced" and snap.diagnosis is not None and snap.diagnosis.reason == "stalled"
    assert len(ctl.logs.runs()) >= 2  # the stalled run's log files are kept
