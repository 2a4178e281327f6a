"""Run as a service (issue 32): the unit passes `systemd-analyze verify` (no running systemd here), the panel
tells systemd READY=1 over a real unix datagram socket, and SIGTERM stops the panel — not the engine."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from app.backend.service import systemd
from tests.engine.conftest import free_port, panel_containers
from tests.engine.test_multi_actor import REPO, cli


def _verify(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("user_mode", [False, True])
def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path, user_mode: bool) -> None:
    data = tmp_path / "my data"
    must, maybe = systemd.writable_paths(data)
    spec = systemd.UnitSpec((sys.executable, "-m", "app.cli.main", "serve", "--data-dir", str(data)),
                            REPO, user_mode, user="" if user_mode else "root",
                            environment=(("MOET_PANEL_RECIPE", "/srv/100% \"odd\" recipe.toml"),),
                            rw_paths=must, optional_rw_paths=maybe + (tmp_path / "100% missing",))
    res = systemd.install(spec, tmp_path / systemd.UNIT_NAME, enable=False)
    assert not res.enabled and any("systemctl" in ln and "enable --now" in ln for ln in res.lines)
    out = _verify(res.path)
    assert out.returncode == 0, out.stderr
    text = res.path.read_text()
    assert "Type=notify" in text and "KillMode=process" in text and "100%% " in text
    # issue 39 item 6: a watchdog, hardening, a start limit (in [Unit], where systemd reads it)
    unit, service = text.split("[Service]")
    assert "StartLimitIntervalSec=600" in unit and "StartLimitBurst=5" in unit
    for line in ("WatchdogSec=30", "NoNewPrivileges=yes", "UMask=0077"):
        assert line in service.splitlines(), line
    if user_mode:  # a user manager needs a user namespace for these, which loses the docker group
        assert "ProtectSystem" not in text and "PrivateTmp" not in text
    else:
        assert "ProtectSystem=strict" in service and "PrivateTmp=yes" in service
        (rw,) = [ln for ln in service.splitlines() if ln.startswith("ReadWritePaths=")]
        assert f'"{data}"' in rw and f'"{data / ".moet-panel"}"' in rw and str(must[2]) in rw
        assert f'"-{tmp_path}/100%% missing"' in rw  # optional: a missing one does not fail the start
        assert data.is_dir()  # made at install: a missing ReadWritePaths= folder fails the start
    # the check is real: the same unit with a relative ExecStart is refused
    bad = tmp_path / "bad" / systemd.UNIT_NAME
    bad.parent.mkdir()
    bad.write_text(text.replace(f"ExecStart={sys.executable}", "ExecStart=python3-relative"))
    assert _verify(bad).returncode != 0


def test_cli_install_prints_what_to_run_and_how_to_check(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"), "MOET_PANEL_NOTIFY": "json://u:s3cret@h/x"}
    out = subprocess.run([sys.executable, "-m", "app.cli.main", "service", "install", "--user"], capture_output=True,
                         text=True, timeout=60, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr
    unit = tmp_path / "config" / "systemd" / "user" / systemd.UNIT_NAME
    assert unit.exists() and "s3cret" not in unit.read_text()  # notify URLs hold secrets: never in a unit file
    assert "systemctl --user enable --now moet-panel" in out.stdout
    assert "systemctl --user status moet-panel" in out.stdout and "journalctl --user-unit moet-panel" in out.stdout
    assert _verify(unit).returncode == 0


def test_sd_notify_ready_and_sigterm_leaves_the_engine_running(tmp_path: Path, docker_client, sim_settings,
                                                               recipe_file: Path) -> None:
    data = tmp_path / "home" / ".local" / "share" / "moet-panel"
    started = cli(recipe_file, data, "engine", "start", "--profile", "quality")
    assert started.returncode == 0, started.stdout + started.stderr
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.settimeout(180)  # a deadline for the panel's start on a loaded box, not a sleep
    env = {**os.environ, "NOTIFY_SOCKET": str(sock_path), "MOET_PANEL_GPU": "none", "MOET_SIM_BOOT_S": "1",
           "WATCHDOG_USEC": "2000000"}  # WatchdogSec=2: a ping a second, earned (service/watchdog.py)
    env.pop("WATCHDOG_PID", None)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "serve", "--recipe", str(recipe_file),
                             "--data-dir", str(data), "--port", str(free_port()), "--demo"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        msg = sock.recv(4096).decode()
        assert msg.startswith("READY=1") and "STATUS=panel at http://127.0.0.1:" in msg
        assert sock.recv(4096).decode() == "WATCHDOG=1"  # the watchdog pings once the panel is ready
        proc.send_signal(signal.SIGTERM)
        while (msg := sock.recv(4096).decode()) == "WATCHDOG=1":  # pings already on their way
            pass
        assert msg == "STOPPING=1"
        assert proc.wait(60) == 0
        (c,) = panel_containers(docker_client, sim_settings.recipe.id)  # the engine kept serving
        assert c.status == "running"
        st = cli(recipe_file, data, "engine", "status")
        assert st.returncode == 0, st.stdout + st.stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        sock.close()
        for c in panel_containers(docker_client, sim_settings.recipe.id, running_only=False):
            c.remove(force=True)


def test_sd_notify_without_systemd_is_a_no_op(monkeypatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.sd_notify("READY=1") is False


def test_cli_service_status_shows_urls_masked() -> None:
    """issue 40 item 7: the CLI shows notify URLs through the one masking function, like the Service tab."""
    import json
    import shutil
    import uuid

    base = Path.home() / f"moet-test-ops-status-{uuid.uuid4().hex[:8]}"
    try:
        state = base / "data" / ".moet-panel"
        state.mkdir(parents=True)
        (state / "service.json").write_text(json.dumps({"restart_policy": "never", "notify_urls": [
            "json://carol:Hunter2Secret@example.org/hooks/AbC123TokenPath?token=QuErY999"]}))
        env = {k: v for k, v in os.environ.items() if k != "MOET_PANEL_NOTIFY"}
        out = subprocess.run([sys.executable, "-m", "app.cli.main", "service", "status", "--demo", "--data-dir",
                              str(base / "data")], capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
        assert out.returncode == 0, out.stderr
        assert "restart policy : never (from the panel setting)" in out.stdout
        assert "json://***:***@example.org/***/***?token=***" in out.stdout
        for secret in ("carol", "Hunter2Secret", "AbC123TokenPath", "QuErY999"):
            assert secret not in out.stdout + out.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)
