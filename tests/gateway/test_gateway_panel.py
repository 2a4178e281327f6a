"""Inference keys grant nothing of the panel; the gateway's bind rule; the CLI's keys and gateway commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.backend.web.auth import add_user, load_users, make_checker
from app.backend.gateway.keys import KeyStore
from app.backend.gateway.server import GatewayConfig, GatewayConfigError, check_config
from tests.conftest import ROOT, close_panel, launch_panel


def test_an_inference_key_opens_nothing_of_the_panel(tmp_path: Path) -> None:
    users = tmp_path / "auth"
    add_user(users, "alice", "correct horse battery")
    panel = launch_panel(tmp_path / "data", auth=make_checker(load_users(users)))
    try:
        key = panel.state.gateway.create_key("laptop").key
        bearer = {"Authorization": f"Bearer {key}"}
        with httpx.Client(timeout=10, follow_redirects=False) as c:
            for path in ("/config", "/gradio_api/info"):
                assert c.get(panel.url + path, headers=bearer).status_code == 401, path
            r = c.post(panel.url + "/gradio_api/queue/join", headers=bearer,
                       json={"data": [], "fn_index": 0, "session_hash": "x"})
            assert r.status_code in (401, 403)
            assert c.post(panel.url + "/login", data={"username": "laptop", "password": key}).status_code == 400
    finally:
        close_panel(panel)


def test_binding_beyond_loopback_needs_tls_or_insecure_http_and_a_key(tmp_path: Path) -> None:
    check_config(GatewayConfig(host="127.0.0.1"), active_keys=0)  # loopback: nothing needed
    check_config(GatewayConfig(host="::1"), active_keys=0)
    with pytest.raises(GatewayConfigError, match="without TLS"):
        check_config(GatewayConfig(host="0.0.0.0"), active_keys=1)
    with pytest.raises(GatewayConfigError, match="no API key"):
        check_config(GatewayConfig(host="0.0.0.0", insecure_http=True), active_keys=0)
    check_config(GatewayConfig(host="0.0.0.0", insecure_http=True), active_keys=1)
    with pytest.raises(GatewayConfigError, match="both --tls-cert"):
        check_config(GatewayConfig(host="0.0.0.0", tls_cert=tmp_path / "c.pem"), active_keys=1)
    (tmp_path / "c.pem").write_text("not a certificate")
    (tmp_path / "k.pem").write_text("not a key")
    with pytest.raises(GatewayConfigError, match="cannot load the TLS"):
        check_config(GatewayConfig(host="box.example", tls_cert=tmp_path / "c.pem", tls_key=tmp_path / "k.pem"), 1)


def _cli(*args: str, data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.cli.main", *args, "--demo", "--data-dir", str(data)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_keys_cli_create_once_list_json_revoke(tmp_path: Path) -> None:
    data = tmp_path / "home" / "data"
    made = _cli("keys", "create", "laptop", "--expires-days", "30", "--json", data=data)
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)["key"]
    assert key.startswith("mpk-") and len(key) > 40
    listed = _cli("keys", "list", "--json", data=data)
    (row,) = json.loads(listed.stdout)
    assert {"name", "requests", "prompt_tokens", "completion_tokens", "last_used"} <= row.keys()
    assert row["name"] == "laptop" and row["status"] == "active" and row["scope"] == "inference"
    assert key not in listed.stdout
    assert _cli("keys", "create", "laptop", data=data).returncode == 2  # the name is taken
    bad = _cli("keys", "create", "a\r\nX-Evil: 1", data=data)
    assert bad.returncode == 2 and "not allowed" in (bad.stdout + bad.stderr) and "Traceback" not in bad.stderr
    assert _cli("keys", "revoke", "laptop", data=data).returncode == 0
    assert _cli("keys", "revoke", "laptop", data=data).returncode == 1
    assert json.loads(_cli("keys", "list", "--json", data=data).stdout)[0]["status"] == "revoked"
    assert KeyStore(data / ".moet-panel").authenticate(key) is None


def test_keys_cli_sets_a_keys_own_max_tokens_cap(tmp_path: Path) -> None:
    data = tmp_path / "home" / "data"
    assert _cli("keys", "create", "batch", "--max-tokens", "32768", "--json", data=data).returncode == 0
    assert json.loads(_cli("keys", "list", "--json", data=data).stdout)[0]["max_tokens"] == 32768
    assert _cli("keys", "set", "batch", "--max-tokens", "0", data=data).returncode == 0  # the gateway's cap again
    assert json.loads(_cli("keys", "list", "--json", data=data).stdout)[0]["max_tokens"] is None
    bad = _cli("keys", "set", "batch", "--max-tokens", "-5", data=data)
    assert bad.returncode == 2 and "max tokens -5" in bad.stderr and "Traceback" not in bad.stderr
    assert _cli("keys", "set", "nobody", "--max-tokens", "10", data=data).returncode == 1


def test_gateway_cli_refuses_an_exposed_bind_without_a_key(tmp_path: Path) -> None:
    r = _cli("gateway", "--host", "0.0.0.0", "--port", "0", "--insecure-http", data=tmp_path / "d")
    assert r.returncode == 2 and "no API key" in r.stderr and "Traceback" not in r.stderr
    r = _cli("gateway", "--host", "0.0.0.0", "--port", "0", data=tmp_path / "d")
    assert r.returncode == 2 and "without TLS" in r.stderr
