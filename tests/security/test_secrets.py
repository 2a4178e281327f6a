"""The HF token never shows up in logs, the page HTML/JSON, the serve banner or `engine status`."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.backend.oplog.redact import install_log_redaction
from tests.conftest import free_port, serve_demo_process

TOKEN = "hf_MoetPanelTestTokenDoNotLeak1234567890"
ODD_TOKEN = "mirror-token-Zq8v3-not-hf-shaped"  # a non-hf_-shaped token the process has loaded


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GRADIO_SERVER", "MOET_PANEL_", "HF_"))}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "share"),
               HF_TOKEN=TOKEN, GRADIO_ANALYTICS_ENABLED="False", PYTHONUNBUFFERED="1", **extra)
    return env


def test_log_records_are_redacted_whoever_logs_them(caplog: pytest.LogCaptureFixture) -> None:
    from app.backend.config import hf_token

    install_log_redaction()
    hf_token.KNOWN.add(ODD_TOKEN)
    log = logging.getLogger("some.library")
    with caplog.at_level(logging.INFO):
        log.info("GET with Authorization: Bearer %s", TOKEN)
        log.warning(f"token file said {ODD_TOKEN}")
        try:
            raise RuntimeError(f"401 for token {TOKEN}")
        except RuntimeError:
            log.exception("download failed")
    text = caplog.text + "".join(r.getMessage() for r in caplog.records)
    assert TOKEN not in text and ODD_TOKEN not in text
    assert text.count("hf_***") >= 3


@pytest.mark.slow
def test_serve_banner_pages_and_logs_never_show_the_token(tmp_path: Path) -> None:
    port = free_port()
    log_path = tmp_path / "serve.log"
    with serve_demo_process(port, log_path, _env(tmp_path), 90) as proc:
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=15) as c:
            for path in ("/", "/config", "/gradio_api/info", "/gradio_api/openapi.json"):
                r = c.get(base + path)
                assert r.status_code == 200, (path, r.status_code)
                assert TOKEN not in r.text, f"token leaked in {path}"
            assert "profile-cards" in c.get(base + "/config").text
        banner = log_path.read_text()
        assert f"http://127.0.0.1:{port}" in banner
        assert "demo     : yes" in banner and "auth     : off" in banner
        assert str(tmp_path / "share" / "moet-panel" / "demo") in banner  # per-user demo data dir
    assert TOKEN not in log_path.read_text()
    assert proc.returncode == 0, log_path.read_text()[-2000:]


@pytest.mark.slow  # starts a panel or an engine (the quick tier leaves it to the full run)
def test_engine_status_never_shows_the_token(tmp_path: Path) -> None:
    env = _env(tmp_path, MOET_PANEL_DEMO="1")
    proc = subprocess.run([sys.executable, "-m", "app.cli.main", "engine", "status", "--data-dir", str(tmp_path / "d")],
                          capture_output=True, text=True, timeout=120, env=env)
    out = proc.stdout + proc.stderr
    assert out.strip(), "engine status printed nothing"
    assert TOKEN not in out


def test_exported_chats_never_show_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real answer from the SIMULATED engine, exported both ways, with the token in the environment."""
    import io

    from app.backend.chat.client import SamplingParams
    from app.backend.chat.conversations import ChatService
    from app.backend.contracts import EngineSnapshot, EngineState
    from app.backend.config.settings import resolve_settings
    from app.backend.simengine import SimEngineConfig, SimEngineServer

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    sim = SimEngineServer(SimEngineConfig(port=0, boot_s=0.0, decode_tok_s=2000.0), log=io.StringIO()).start()
    settings = resolve_settings(demo=True, data_dir=tmp_path / "data")
    snap = EngineSnapshot(state=EngineState.READY, profile_id="quality", base_url=sim.base_url,
                          served_name=sim.config.served_name, simulated=True)
    chat = ChatService(settings.recipe, settings.ensure_state_dir(), snapshot_fn=lambda: snap)
    try:
        assert sim.wait_ready(10)
        conv = chat.new_conversation(system_prompt="be brief")
        turn = chat.send(conv.id, "What does the FP4 pool do?", SamplingParams(1.0, 1.0, 0.05, max_tokens=64))
        assert turn.done.wait(30), "the answer never finished"
        exported = chat.export_json(conv.id) + chat.export_markdown(conv.id)
        assert "FP4 pool" in exported and "profile" in exported.lower()  # the export is real
        assert TOKEN not in exported
        assert TOKEN not in (settings.state_dir / "chat.sqlite").read_bytes().decode("latin-1")
    finally:
        chat.close()
        sim.stop()
