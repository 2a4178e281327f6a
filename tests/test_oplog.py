"""The operator's log (app.backend.oplog): one key=value line per decision, caught errors counted, the file
private and rotated, no secret in it."""

from __future__ import annotations

import io
import logging
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.backend import oplog


@pytest.fixture
def configured(tmp_path: Path) -> Iterator[tuple[Path, io.StringIO]]:
    root = logging.getLogger()
    before = list(root.handlers)
    stream = io.StringIO()
    had = getattr(root, oplog._CONFIGURED, False)
    if had:
        delattr(root, oplog._CONFIGURED)
    oplog.configure(tmp_path, stream=stream)
    try:
        yield tmp_path, stream
    finally:
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)
                h.close()
        if had:
            setattr(root, oplog._CONFIGURED, True)
        elif hasattr(root, oplog._CONFIGURED):
            delattr(root, oplog._CONFIGURED)


def test_a_decision_is_one_key_value_line_with_who_asked(configured: tuple[Path, io.StringIO]) -> None:
    state_dir, stream = configured
    oplog.decision("engine", "restart", who=oplog.SUPERVISOR, reason="crashed (exit 137)", profile="quality")
    line = stream.getvalue().strip().splitlines()[-1]
    assert "level=INFO logger=moet_panel.engine component=engine action=restart who=supervisor" in line
    assert 'reason="crashed (exit 137)" profile=quality' in line
    assert oplog.read_lines(state_dir, 1) == [line]
    assert stat.S_IMODE(oplog.log_path(state_dir).stat().st_mode) == 0o600


def test_a_caught_error_is_logged_once_and_counted_by_component(configured: tuple[Path, io.StringIO]) -> None:
    _, stream = configured
    before = oplog.error_counts().get("gateway", 0)
    oplog.caught("gateway", ConnectionResetError("peer gone"), "forwarding a stream", key="k1")
    assert oplog.error_counts()["gateway"] == before + 1
    text = stream.getvalue()
    assert text.count("peer gone") == 1
    assert 'context="forwarding a stream"' in text and "level=WARNING" in text


def test_no_hf_token_reaches_the_log(configured: tuple[Path, io.StringIO]) -> None:
    state_dir, stream = configured
    token = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7"
    oplog.decision("downloads", "start", who=oplog.user("alice"), url=f"https://x/?t={token}")
    try:
        raise RuntimeError(f"auth failed with {token}")
    except RuntimeError as exc:
        oplog.caught("downloads", exc, "listing the repo", traceback=True)
    assert token not in stream.getvalue()
    assert token not in oplog.log_path(state_dir).read_text()
