"""Binding and auth: loopback by default, non-loopback refused without auth, auth covers UI and API routes."""

from __future__ import annotations

import argparse
import asyncio
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.backend.web.auth import AuthError, BindingError, add_user, is_loopback, load_users, make_checker, verify_password
from app.cli.serve import plan
from tests.conftest import close_panel, launch_panel


class _Probe:
    demo_reason = "no usable NVIDIA GPU (test)"


def _args(**kw: object) -> argparse.Namespace:
    base = dict(host=None, port=None, demo=False, auth_file=None, add_user=None, recipe=None, data_dir=None)
    base.update(kw)
    return argparse.Namespace(**base)


def run_async(coro: Any) -> Any:
    """asyncio.run in a thread of its own: Playwright's sync API may hold this thread's event loop."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ("GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT", "MOET_PANEL_AUTH_FILE", "MOET_PANEL_DEMO", "MOET_PANEL_RECIPE",
                "MOET_PANEL_DATA_DIR", "MOET_PANEL_ALLOWED_HOSTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share"))
    return tmp_path


@pytest.fixture
def auth_file(tmp_path: Path) -> Path:
    path = tmp_path / "auth"
    add_user(path, "alice", "correct horse battery")
    return path


def test_loopback_is_the_default_and_demo_data_dir_is_per_user(clean_env: Path) -> None:
    p = plan(_args(), probe=_Probe())
    assert p.host == "127.0.0.1" and p.port == 7860 and p.auth_file is None
    assert p.settings.demo and p.settings.recipe.simulated
    assert p.settings.data_dir == clean_env / "share" / "moet-panel" / "demo"
    assert p.settings.demo_reason == p.demo_reason != ""  # the page shows it (app.ui.app sim banner)


def test_real_hardware_uses_the_card_recipe_and_its_data_dir(clean_env: Path) -> None:
    class Ok:
        demo_reason = ""

    p = plan(_args(), probe=Ok())
    assert not p.settings.demo and p.demo_reason == ""
    assert p.settings.recipe.id == "ds4-flash-0731-sm120" and str(p.settings.data_dir) == "/data/ds4"


def test_demo_keeps_a_recipe_the_user_passed(clean_env: Path, tmp_path: Path) -> None:
    from app.backend.recipe import DEFAULT_RECIPE

    p = plan(_args(demo=True, recipe=str(DEFAULT_RECIPE), data_dir=str(tmp_path / "d")), probe=None)
    assert p.settings.demo and p.settings.recipe.id == "ds4-flash-0731-sm120"
    assert p.settings.data_dir == tmp_path / "d" and "requested" in p.demo_reason


@pytest.mark.parametrize("how", ["flag", "env"])
def test_non_loopback_refused_without_auth(clean_env: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    if how == "env":
        monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
        args = _args()
    else:
        args = _args(host="192.168.1.20")
    with pytest.raises(BindingError) as info:
        plan(args, probe=_Probe())
    msg = str(info.value)
    assert "without authentication" in msg and "root" in msg and "--auth-file" in msg


def test_non_loopback_allowed_with_auth_file_flag_or_env(clean_env: Path, auth_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert plan(_args(host="0.0.0.0", auth_file=str(auth_file)), probe=_Probe()).auth_file == auth_file
    monkeypatch.setenv("MOET_PANEL_AUTH_FILE", str(auth_file))
    assert plan(_args(host="0.0.0.0"), probe=_Probe()).auth_file == auth_file


def test_serve_cli_refuses_exposed_bind_with_exit_2(clean_env: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADIO_", "MOET_PANEL_"))}
    env.update(HOME=str(clean_env), MOET_PANEL_DEMO="1")
    proc = subprocess.run([sys.executable, "-m", "app.cli.main", "serve", "--host", "0.0.0.0"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2
    assert "refusing to listen on '0.0.0.0' without authentication" in proc.stderr


def test_loopback_detection() -> None:
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.5.5.5", "::1", "[::1]", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "panel.example", ""))


def test_add_user_cli_writes_0600_scrypt_file_from_stdin(clean_env: Path) -> None:
    path = clean_env / "conf" / "users"
    cmd = [sys.executable, "-m", "app.cli.main", "serve", "--add-user", "bob", "--auth-file", str(path)]
    proc = subprocess.run(cmd, input="s3cret-pass-word\n", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "s3cret-pass-word" not in text and "bob:scrypt$" in text
    assert run_async(make_checker(load_users(path))("bob", "s3cret-pass-word"))
    short = subprocess.run(cmd, input="short\n", capture_output=True, text=True, timeout=60)
    assert short.returncode == 2 and "at least 8" in short.stderr


def test_checker_rejects_wrong_password_and_unknown_user(auth_file: Path) -> None:
    checker = make_checker(load_users(auth_file))

    def check(user: str, password: str) -> bool:
        return run_async(checker(user, password))

    assert check("alice", "correct horse battery")
    assert not check("alice", "wrong password!")
    assert not check("mallory", "correct horse battery")
    assert not verify_password("x", "plain-text-not-a-hash")


def test_unsafe_or_malformed_auth_file_is_refused(tmp_path: Path, auth_file: Path) -> None:
    os.chmod(auth_file, 0o666)
    with pytest.raises(AuthError, match="writable by other users"):
        load_users(auth_file)
    bad = tmp_path / "bad"
    bad.write_text("alice:plaintextpassword\n")
    os.chmod(bad, 0o600)
    with pytest.raises(AuthError, match="line 1"):
        load_users(bad)
    with pytest.raises(AuthError, match="cannot read"):
        load_users(tmp_path / "missing")


@pytest.fixture
def authed_panel(tmp_path: Path, auth_file: Path):
    p = launch_panel(tmp_path / "data", auth=make_checker(load_users(auth_file)))
    try:
        yield p
    finally:
        close_panel(p)


def test_auth_covers_ui_and_api_routes(authed_panel) -> None:
    url = authed_panel.url
    with httpx.Client(timeout=10, follow_redirects=False) as c:
        for path in ("/config", "/gradio_api/info", "/gradio_api/openapi.json"):
            r = c.get(url + path)
            assert r.status_code == 401, (path, r.status_code)
            assert "docker run" not in r.text and "VLLM_MOE_W2" not in r.text
        for path in ("/", "/?all_endpoints=true"):
            page = c.get(url + path)  # the login page: no components, no API description
            assert "VLLM_MOE_W2" not in page.text and "profile-cards" not in page.text and "/select" not in page.text
        for path, body in (("/gradio_api/queue/join", {"data": [], "fn_index": 0, "session_hash": "x"}),
                           ("/gradio_api/run/predict", {"data": []}), ("/gradio_api/call/select", {"data": ["quality", False]})):
            r = c.post(url + path, json=body)
            assert r.status_code in (401, 403), (path, r.status_code)
        bad = c.post(url + "/login", data={"username": "alice", "password": "nope-nope-nope"})
        assert bad.status_code == 400
        good = c.post(url + "/login", data={"username": "alice", "password": "correct horse battery"})
        assert good.status_code == 200, good.text
        cfg = c.get(url + "/config", headers={"X-Moet-Session": good.headers["x-moet-session-key"]})
        assert cfg.status_code == 200 and "profile-cards" in cfg.text


@pytest.mark.browser
@pytest.mark.slow
def test_browser_login_then_ui_works(authed_panel, browser) -> None:
    page = browser.new_page(1280, 800)
    page.goto(authed_panel.url)
    page.get_by_label("username", exact=False).fill("alice")
    page.get_by_label("password", exact=False).fill("correct horse battery")
    page.get_by_role("button", name="Login").click()
    page.wait_for_selector("#profile-cards")
    page.get_by_label("#3 max speed", exact=True).check()
    page.locator('.moet-card.selected[data-profile="speed"]').wait_for()
    page.wait_for_function("() => document.querySelector('#profile-command textarea').value.includes('DELTA_POLICY=need')")
    assert not browser.console_errors, browser.console_errors


def test_allowed_hosts_come_from_flags_and_env(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert plan(_args(), probe=_Probe()).allowed_hosts == ()
    monkeypatch.setenv("MOET_PANEL_ALLOWED_HOSTS", "proxy.example")
    p = plan(_args(allowed_host=["Panel.Example:8443"]), probe=_Probe())
    assert p.allowed_hosts == ("proxy.example", "panel.example:8443")
    with pytest.raises(BindingError, match="allowed host 'http://x'"):
        plan(_args(allowed_host=["http://x"]), probe=_Probe())
