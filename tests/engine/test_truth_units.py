"""Units of the 'one truth' work: the shared pool-sizing classifier, probe-line filter, exit classifier,
liveness tracker, CLI option placement, the journal-backed artifact item and build_app_state's wiring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.backend.engine.logs.bootlog import BootTracker
from app.backend.engine.logs.exits import explain_exit
from app.backend.engine.supervision.stall import LivenessTracker, Progress
from app.backend.engine.logs.loglines import is_panel_probe, pool_sizing
from app.backend.engine.runtime.base import Instance
from app.backend.telemetry.trace import TraceParser

LINES = [
    "(EngineCore_DP0 pid=301) INFO 07-31 10:00:01 [moe_w2_delta.py:410] moe_w2 delta tier: 287 slots x 24.5 MiB "
    "(6.87 GiB pool)",
    "(EngineCore_DP0 pid=301) INFO 07-31 10:00:01 [moe_w2_delta.py:516] moe_w2 delta tier AUTO: 163 slots x 24.5 MiB "
    "(3.90 GiB pool; 6.90 GiB was free after KV, reserve 3.0 GiB)",
    "(EngineCore_DP0 pid=301) INFO 07-31 10:00:01 [moe_w2_delta.py:505] moe_w2 delta tier AUTO: 2.37 GiB free after "
    "KV < reserve 3.0 GiB -> pool disabled (0 slots, pure 2-bit; host store released)",
]


@pytest.mark.parametrize("line", LINES)
def test_boot_tracker_and_trace_parser_agree_on_the_pool(line: str) -> None:
    tracker = BootTracker()
    tracker.feed(line)
    parser = TraceParser()
    parser.feed_line(line, 1.0)
    sizing = parser.snapshot().sizing
    assert sizing is not None and tracker.progress.pool == sizing  # one PoolSizing, the same value in both
    assert pool_sizing(line.split("] ", 1)[1]) is not None


def test_probe_lines_are_the_panels_own_polling_only() -> None:
    assert is_panel_probe('(APIServer pid=1) INFO:     127.0.0.1:51234 - "GET /metrics HTTP/1.1" 200 OK')
    assert is_panel_probe('INFO:     127.0.0.1:5 - "GET /health HTTP/1.1" 200 OK')
    assert is_panel_probe('INFO:     127.0.0.1:5 - "GET /v1/models HTTP/1.1" 200 OK')
    assert not is_panel_probe('INFO:     127.0.0.1:5 - "POST /v1/chat/completions HTTP/1.1" 200 OK')
    assert not is_panel_probe('INFO:     10.1.2.3:5 - "GET /metrics HTTP/1.1" 200 OK')  # someone else's scraper


def _inst(code: int, oom: bool = False, error: str = "") -> Instance:
    return Instance("c1", "ds4", "exited", exit_code=code, oom_killed=oom, error=error,
                    finished_at="2026-12-01T10:00:00.123Z")


def test_exit_classifier_names_sigkill_and_a_clean_stop() -> None:
    k = explain_exit(_inst(137), ["INFO serving"])
    assert k.title == "killed (SIGKILL, exit 137)" and "journalctl -k" in k.fix and "64 GB" in k.explanation + k.fix
    assert "2026-12-01 10:00:00" in k.fix
    s = explain_exit(_inst(0), ["INFO:     Shutting down", "INFO:     Finished server process [7]"])
    assert s.reason == "stopped_outside_panel" and "Nothing is broken" in s.fix
    assert explain_exit(_inst(143), []).reason == "stopped_outside_panel"
    assert explain_exit(_inst(137, oom=True), []).reason == "host_oom_kill"
    assert explain_exit(None, []).reason == "removed_outside_panel"
    assert "OCI" in explain_exit(_inst(127, error="OCI runtime create failed"), []).title


def test_liveness_needs_running_requests_and_frozen_counters() -> None:
    t = LivenessTracker(stall_after_s=10)
    assert not t.feed(Progress(0, 1, 100, 5)).stalled
    assert not t.feed(Progress(9, 1, 100, 5)).stalled
    v = t.feed(Progress(10.5, 1, 100, 5))
    assert v.stalled and v.idle_s == pytest.approx(10.5)
    assert not t.feed(Progress(11, 1, 101, 5)).stalled  # a token moved
    assert not t.feed(Progress(30, 0, 101, 5)).stalled  # idle engine: nothing to produce


def test_global_options_accepted_at_any_level() -> None:
    from app.cli.main import hoist_global_options

    rest, found = hoist_global_options(["engine", "start", "--profile", "quality", "--demo", "--recipe=x.toml",
                                        "--data-dir", "/d", "--json"])
    assert rest == ["engine", "start", "--profile", "quality"]
    assert found == {"demo": True, "recipe": "x.toml", "data_dir": "/d", "json": True}


def test_unreachable_docker_host_is_reported_not_replaced(monkeypatch, tmp_path: Path, capsys) -> None:
    from app.cli.main import main

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    monkeypatch.setenv("MOET_PANEL_GPU", "none")
    assert main(["engine", "status", "--demo", "--data-dir", str(tmp_path)]) == 3
    out = capsys.readouterr().out
    assert "Docker daemon unreachable at unix:///nonexistent.sock" in out and "local process" not in out


def test_demo_data_dir_is_the_same_for_serve_and_cli(monkeypatch, tmp_path: Path) -> None:
    from app.backend.config.settings import demo_data_dir, resolve_settings

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.delenv("MOET_PANEL_DATA_DIR", raising=False)
    assert resolve_settings(None, None, demo=True).data_dir == demo_data_dir() == tmp_path / "moet-panel" / "demo"


def test_half_extracted_artifact_fails_preflight_with_resume(tmp_path: Path) -> None:
    from app.backend.download.journal import downloads_dir
    from app.backend.download.journal import artifact_status
    from app.backend.engine.lifecycle.preflight import PreflightInputs, _artifacts
    from app.backend.recipe import DEFAULT_RECIPE, load_recipe
    from app.backend.config.settings import Settings

    recipe = load_recipe(DEFAULT_RECIPE)
    art = next(a for a in recipe.artifacts if a.required_for_serving)
    st = Settings(DEFAULT_RECIPE, recipe, tmp_path)
    (tmp_path / art.yields).mkdir(parents=True)
    (tmp_path / art.yields / "some-file").write_text("x")  # non-empty directory: looked complete before
    downloads_dir(tmp_path).mkdir(parents=True)
    (downloads_dir(tmp_path) / f"{art.id}.json").write_text(json.dumps({
        "artifact": art.id, "repo": "r", "commit": "c", "endpoint": "e", "segment_size": 1,
        "parts": [{"name": "p0", "size": 1, "sha256": "0"}], "files_done": {"some-file": 1},
        "extraction_started": True, "state": "paused", "version": 1}))
    item = next(i for i in _artifacts(PreflightInputs(recipe=recipe, env={}, data_dir=tmp_path, runtime=None,
                                                      artifact_status=lambda a: artifact_status(st.data_dir, a)))
                if i.id == f"artifact:{art.id}")
    assert item.status == "fail" and "half-extracted" in item.detail and "Resume the download" in item.fix


def test_build_app_state_wires_every_collaborator(monkeypatch, tmp_path: Path) -> None:
    from app.backend.config.settings import resolve_settings
    from app.backend.state import build_app_state

    monkeypatch.setenv("MOET_PANEL_GPU", "simulated")
    state = build_app_state(resolve_settings(None, tmp_path / "d", demo=True))
    try:
        ctl = state.engine
        assert state.gpu is not None and ctl._boot.gpu_reader is state.gpu and state.telemetry.gpu_reader is state.gpu
        assert ctl._boot.artifact_status is not None and ctl._boot.artifact_status("planescache") is None  # journals read
        assert state.telemetry._engine is ctl  # engine into telemetry
        assert state.chat is not None and state.downloads is not None
        # chat and telemetry follow the engine's change events, one watch each (docs/engine.md, "Who listens")
        assert state.chat._watch is not None and state.chat._watch.snapshot is ctl.snapshot()
        assert state.telemetry._watch is not None
        assert state.selftest is not None and state.abtest is not None
        assert state.telemetry.drift is not None  # the self-test's baseline feeds the drift alert
        assert state.gpu.read() is not None  # the shared reader follows the engine's snapshot
    finally:
        state.close()
    assert state.telemetry._thread is None  # close() stopped the sampler
    assert ctl.events.subscribers == 0  # every listener unsubscribed on close (none leaked)


def test_serve_opens_nvml_once_and_the_app_state_keeps_that_reader(monkeypatch, tmp_path: Path) -> None:
    """`serve`'s host probe and the running panel share one NVML reader: opened once in `run`, probed for the
    demo decision, then handed to build_app_state (engine preflight/release wait and telemetry read it)."""
    import argparse

    from app.backend.telemetry import hostprobe
    from app.backend.recipe import SIMULATED_RECIPE
    from app.backend.state import build_app_state
    from app.backend.telemetry import nvml as nvml_mod
    from app.cli import serve
    from tests.telemetry.test_gpu import FakeNvml

    fake = FakeNvml()
    opened: list[object] = []
    real_init = nvml_mod.NvmlGpuReader.__init__

    def counting_init(self, *args, **kwargs) -> None:  # every NVML open in this process, whoever makes it
        kwargs.setdefault("nvml", fake)
        real_init(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(nvml_mod.NvmlGpuReader, "__init__", counting_init)
    monkeypatch.setattr(hostprobe, "probe_docker", lambda timeout_s=3.0: (True, "Docker (test)"))
    for name in ("MOET_PANEL_GPU", "MOET_PANEL_DEMO", "MOET_PANEL_DATA_DIR", "MOET_PANEL_RECIPE"):
        monkeypatch.delenv(name, raising=False)
    handed: list[tuple[serve.Plan, object]] = []
    monkeypatch.setattr(serve, "_serve", lambda p, nvml: handed.append((p, nvml)) or 0)
    args = argparse.Namespace(host=None, port=None, demo=False, auth_file=None, add_user=None, allowed_host=[],
                              recipe=str(SIMULATED_RECIPE), data_dir=str(tmp_path / "d"))
    assert serve.run(args) == 0
    [(p, reader)] = handed
    assert p.demo_reason == ""  # the probe read the (fake) GPU through that reader
    assert opened == [reader] and fake.calls["nvmlInit"] == 1
    state = build_app_state(p.settings, nvml_reader=reader)  # type: ignore[arg-type]
    try:
        assert opened == [reader] and fake.calls["nvmlInit"] == 1  # nothing opened NVML a second time
        assert state.gpu is reader and state.engine._boot.gpu_reader is reader and state.telemetry.gpu_reader is reader
    finally:
        state.close()
