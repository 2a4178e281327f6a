"""Daemon-unreachable errors, the SIMULATED process runtime, and image builds (docker-py and CLI paths)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from app.backend.engine.controller import ControllerOptions, EngineController
from app.backend.engine.runtime.docker import DockerRuntime
from app.backend.engine.runtime.choice import select_runtime
from app.backend.engine.builds.image import ImageBuildRefused, build_image, check_source
from app.backend.engine.runtime.process import ProcessRuntime
from app.backend.engine.runtime.base import RuntimeUnavailable
from app.backend.contracts import EngineState, slots_of
from app.backend.recipe import DEFAULT_RECIPE, load_recipe
from app.backend.config.settings import Settings

from .conftest import TEST_LABEL, free_port, sim_recipe

NOWHERE = "unix:///nonexistent/docker.sock"


def test_daemon_unreachable_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", NOWHERE)
    with pytest.raises(RuntimeUnavailable) as err:
        DockerRuntime().check()
    msg = str(err.value)
    assert msg.startswith(f"Docker daemon unreachable at {NOWHERE}: ")
    assert "is dockerd running / are you in the docker group?" in msg


def test_real_recipe_without_daemon_fails_start_with_diagnosis(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", NOWHERE)
    st = Settings(DEFAULT_RECIPE, load_recipe(DEFAULT_RECIPE), tmp_path, False)
    rt, note = select_runtime(st)
    assert rt is None and NOWHERE in note  # no silent process fallback for a real recipe
    ctl = EngineController(st, runtime_factory=lambda: select_runtime(st), options=ControllerOptions(reattach=False))
    report = ctl.preflight("quality")
    docker_item = next(i for i in report.items if i.id == "docker")
    assert docker_item.status == "fail" and NOWHERE in docker_item.detail
    t = ctl.start("quality", overrides=tuple(i.id for i in report.blocking()))  # even forced: no daemon, no engine
    assert t.wait(10) and t.ok is False
    assert ctl.snapshot().diagnosis.reason == "docker_unreachable"
    assert NOWHERE in ctl.snapshot().diagnosis.explanation


@pytest.mark.slow
def test_process_runtime_start_reattach_stop(tmp_path: Path) -> None:
    """Demo mode without Docker: same lifecycle, reattach through the process registry."""
    st = Settings(DEFAULT_RECIPE, sim_recipe(free_port()), tmp_path, True)
    opts = ControllerOptions(extra_env={"MOET_SIM_BOOT_S": "1"}, extra_labels=dict(TEST_LABEL))
    a = EngineController(st, ProcessRuntime(st.state_dir), options=opts)
    b = None
    try:
        t = a.start("quality")
        assert t.wait(30) and t.ok, t.message
        assert a.snapshot().simulated and slots_of(a.snapshot().pool)
        pids = a.container_pids()
        assert pids
        a.close()
        b = EngineController(st, ProcessRuntime(st.state_dir), options=opts)
        assert b.snapshot().state is EngineState.READY and b.snapshot().profile_id == "quality"
        rt, cid = ProcessRuntime(st.state_dir), b.snapshot().container_id
        tail, whole = rt.tail_logs(cid, 5), rt.read_logs(cid)  # the hub's seed of the pool figures (issue 29)
        for stream in ("stdout", "stderr"):  # the last lines (Docker counts entries, not lines)
            got, ws = [t for s, t in tail if s == stream], [t for s, t in whole if s == stream]
            assert 0 < len(got) <= 5 and any(ws[i:i + len(got)] == got for i in range(max(0, len(ws) - len(got) - 20), len(ws)))
        s = b.stop()
        assert s.wait(20) and s.ok
        assert b.snapshot().state is EngineState.STOPPED
        assert ProcessRuntime(st.state_dir).list({}) == []
    finally:
        for ctl in (a, b):
            if ctl is not None:
                ctl.close()
        rt = ProcessRuntime(st.state_dir)
        for inst in rt.list({}):
            rt.remove(inst.id)


# -- image build -------------------------------------------------------------------------------
def _context(tmp_path: Path, ok: bool) -> Path:
    (tmp_path / "payload.txt").write_text("hello\n")
    add = "payload.txt" if ok else "missing-file.txt"
    (tmp_path / "Dockerfile").write_text(f"FROM scratch\nADD {add} /payload.txt\nLABEL moet-panel.test=1\n")
    return tmp_path


def test_build_refuses_without_source_and_explains_no_network() -> None:
    with pytest.raises(ImageBuildRefused) as err:
        check_source(None, "de4af53", "https://github.com/kacper-daftcode/vLLM-Moet", "Dockerfile", False)
    assert "git clone" in str(err.value) and "--source" in str(err.value)


def test_build_refuses_wrong_commit(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    _context(tmp_path, True)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "add", "."], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"], check=True)
    with pytest.raises(ImageBuildRefused) as err:
        check_source(tmp_path, "de4af53", "url", "Dockerfile", False)
    assert "de4af53" in str(err.value)
    assert check_source(tmp_path, "de4af53", "url", "Dockerfile", True) == tmp_path.resolve()


@pytest.mark.docker
@pytest.mark.parametrize("ok", [True, False])
def test_docker_py_build_streams_steps_and_surfaces_errors(docker_client, tmp_path: Path, ok: bool) -> None:
    tag = f"moet-panel-test/build-{'ok' if ok else 'bad'}:1"
    events = []
    try:
        result = build_image(_context(tmp_path, ok), "Dockerfile", tag, {}, events.append, DockerRuntime(docker_client))
        assert result.ok is ok and result.builder == "docker-py"
        assert any(e.step == (1, 3) for e in events)  # "Step 1/3 : FROM scratch"
        if ok:
            assert docker_client.images.get(tag)
        else:
            assert "missing-file.txt" in result.message
            assert events[-1].error
    finally:
        try:
            docker_client.images.remove(tag, force=True)
        except Exception:
            pass


@pytest.mark.docker
def test_buildkit_build_shells_out_and_reports_failure(docker_client, tmp_path: Path) -> None:
    """DOCKER_BUILDKIT=1 (the card's build) goes through the docker CLI; failures come back as a result."""
    if shutil.which("docker") is None:
        pytest.skip("docker CLI not installed")
    tag = "moet-panel-test/build-bk:1"
    events = []
    try:
        result = build_image(_context(tmp_path, False), "Dockerfile", tag, {"DOCKER_BUILDKIT": "1"}, events.append)
        assert result.builder == "buildkit-cli" and result.ok is False
        assert events[0].line.startswith("$ ") and "--progress=plain" in events[0].line
        # either BuildKit ran and failed on the missing file, or buildx is absent and we say how to get it
        assert "missing-file.txt" in " ".join(e.line for e in events) or "buildx" in result.message
    finally:
        try:
            docker_client.images.remove(tag, force=True)
        except Exception:
            pass


def test_cli_status_without_daemon_exits_3_with_the_reason(monkeypatch, tmp_path: Path, capsys) -> None:
    from app.cli.main import main

    monkeypatch.setenv("DOCKER_HOST", NOWHERE)
    monkeypatch.setenv("MOET_PANEL_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MOET_PANEL_GPU", "none")
    assert main(["engine", "--recipe", str(DEFAULT_RECIPE), "status"]) == 3
    out = capsys.readouterr().out
    assert "Docker daemon unreachable at " + NOWHERE in out
    assert main(["engine", "--recipe", str(DEFAULT_RECIPE), "start", "--profile", "nope"]) == 2
    assert "unknown profile" in capsys.readouterr().err


@pytest.mark.slow
def test_a_simulated_build_without_docker_runs_on_the_process_runtime(monkeypatch, tmp_path: Path,
                                                                     oplog_lines) -> None:
    """Issue 49: the upgrade demo without Docker. `build-image --commit next --demo` records the SIMULATED build
    `next` in one line (no docker-py text), its engine runs as a local process with the variant in its
    environment, and a failed build leaves its reason in the operator's log."""
    import psutil

    from app.backend.engine.builds import job as buildjob
    from app.backend.engine.builds.store import registry

    def no_docker(self) -> None:
        raise RuntimeUnavailable("Docker daemon unreachable at unix:///var/run/docker.sock: test")

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(DockerRuntime, "check", no_docker)
    st = Settings(DEFAULT_RECIPE, sim_recipe(free_port()), tmp_path, True)
    out = buildjob.build_demo(st, "next", lambda ev: None)
    assert out.result.ok and out.build is not None and out.build.variant == "next", out.result.message
    assert "local process" in out.result.message and "\n" not in out.result.message
    assert registry(st).get("next").simulated
    job = buildjob.BuildService(st)
    job.start("nope", None, "test")
    assert job.wait(30).state.value == "failed" and "no build 'nope'" in job.progress().message
    assert "error" in oplog_lines.getvalue() and "no build" in oplog_lines.getvalue()  # the reason is logged
    opts = ControllerOptions(extra_env={"MOET_SIM_BOOT_S": "1"}, extra_labels=dict(TEST_LABEL))
    ctl = EngineController(st, ProcessRuntime(st.state_dir), options=opts)
    try:
        t = ctl.start("quality", build="next")
        assert t.wait(30) and t.ok, t.message
        assert ctl.snapshot().build == "next"
        pid = next(iter(ctl.container_pids()))
        assert psutil.Process(pid).environ().get("MOET_SIM_BUILD") == "next"
    finally:
        ctl.close()
        rt = ProcessRuntime(st.state_dir)
        for inst in rt.list({}):
            rt.remove(inst.id)


@pytest.mark.slow
def test_start_and_switch_lines_name_the_gpu_and_ready_says_after_how_long(tmp_path: Path, oplog_lines) -> None:
    """Issue 49, the operator's log on a box of several GPUs: the start and switch lines name the GPU, a `ready`
    line says after how many seconds, and tidying the last run's socket reads as routine."""
    st = Settings(DEFAULT_RECIPE, sim_recipe(free_port()), tmp_path, True)
    opts = ControllerOptions(extra_env={"MOET_SIM_BOOT_S": "1"}, extra_labels=dict(TEST_LABEL), gpu=1, box_engines=2)
    ctl = EngineController(st, ProcessRuntime(st.state_dir), options=opts)
    try:
        t = ctl.start("quality")
        assert t.wait(30) and t.ok, t.message
        t = ctl.switch("balanced")
        assert t.wait(60) and t.ok, t.message
    finally:
        ctl.close()
        rt = ProcessRuntime(st.state_dir)
        for inst in rt.list({}):
            rt.remove(inst.id)
    lines = [x for x in oplog_lines.getvalue().splitlines() if "component=engine" in x]
    for action, profile in (("start", "quality"), ("switch", "balanced")):
        line = next(x for x in lines if f"action={action} " in x)
        assert f"profile={profile} gpu=1" in line, line
        ready = next(x for x in lines if "action=ready " in x and f"profile={profile}" in x)
        assert "gpu=1" in ready and float(ready.split("after_s=")[1].split()[0]) > 0, ready
    assert not [x for x in lines if "bind fails" in x or "dead-socket" in x], lines
