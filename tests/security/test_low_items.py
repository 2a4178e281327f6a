"""Issue 30, the low items of finding 6: `serve --host ::` died with a raw traceback after binding; a
group/other-readable auth file was accepted silently; a bad `fn_index` gave 500; chat export dirs
`/tmp/moet-panel-chat-*` were left behind at exit."""

from __future__ import annotations

import pytest

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from app.backend.web.auth import add_user
from tests.conftest import free_port, launch_panel, close_panel


@pytest.mark.slow  # starts a panel or an engine (the quick tier leaves it to the full run)
def test_serve_on_ipv6_any_starts_and_a_readable_auth_file_is_warned_about(tmp_path: Path) -> None:
    auth = tmp_path / "auth"
    add_user(auth, "alice", "correct horse battery")
    os.chmod(auth, 0o644)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADIO_", "MOET_PANEL_"))}
    env.update(HOME=str(tmp_path), MOET_PANEL_DEMO="1")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "serve", "--host", "::", "--port", str(port),
                             "--auth-file", str(auth), "--data-dir", str(tmp_path / "data")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    out: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
            if "  stop     :" in line:  # the banner's last line
                break
        text = "".join(out)
        assert "moet-panel is running" in text, text[-3000:]
        assert "readable by other users" in text and "chmod 600" in text
        assert "sessions : bound to the page's origin; end after 2 h idle or 24 h" in text
        r = httpx.get(f"http://[::1]:{port}/config", timeout=30)
        assert r.status_code == 401  # served, behind the login
    finally:
        proc.terminate()
        rest, _ = proc.communicate(timeout=60)
    assert "Traceback" not in "".join(out) + rest, rest[-3000:]


def test_a_bad_fn_index_is_a_4xx_not_a_500(shared_panel) -> None:
    with httpx.Client(timeout=30) as c:
        for index in (-1, 10**9, "x", 1.5, True):
            for path in ("/gradio_api/queue/join", "/gradio_api/run/predict"):
                r = c.post(shared_panel.url + path, json={"data": [], "fn_index": index, "session_hash": "probe"})
                assert 400 <= r.status_code < 500, (path, index, r.status_code, r.text[:200])


def test_chat_exports_leave_no_temp_dir_behind(tmp_path: Path) -> None:
    before = set(Path(tempfile.gettempdir()).glob("moet-panel-chat-*"))
    p = launch_panel(tmp_path / "data")
    try:
        conv = {"format": "moet-panel.chat", "version": 1, "conversation": {
            "id": "tmpcheck", "title": "tmp check", "messages": [{"role": "user", "content": "hi"}]}}
        cid = p.state.chat.import_json(json.dumps(conv)).id
        exported = p.state.chat.export_file(cid, "md")
        assert exported.exists()
    finally:
        close_panel(p)
    assert not exported.exists()
    assert set(Path(tempfile.gettempdir()).glob("moet-panel-chat-*")) <= before
