"""Secrets at rest (issue 40 item 7): every file the panel writes that holds a secret is the owner's alone
(0600), whatever the umask — checked by mode, all in one place. service.json (Apprise URLs with passwords and
tokens) was written 0644."""

from __future__ import annotations

import io
import logging
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.backend import oplog


@pytest.fixture
def home_dirs(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    base = Path.home() / f"moet-test-ops-rest-{uuid.uuid4().hex[:8]}"
    config, state = base / "config", base / "data" / ".moet-panel"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    old = os.umask(0o022)  # the usual umask: files are 0644 unless the code says otherwise
    try:
        yield config, state
    finally:
        os.umask(old)
        shutil.rmtree(base, ignore_errors=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_file_holding_a_secret_is_0600(home_dirs: tuple[Path, Path]) -> None:
    from app.backend.web import exports
    from app.backend.config import hf_token
    from app.backend.web.auth import add_user, default_auth_path
    from app.backend.gateway.keys import KeyStore
    from app.backend.prometheus.access import MetricsTokenError, load_token
    from app.backend.service.config import ServiceConfig, ServiceConfigStore

    config, state = home_dirs
    state.mkdir(parents=True)
    files: dict[str, Path] = {}

    add_user(default_auth_path(), "alice", "correct horse battery staple")
    files["auth file (scrypt hashes)"] = default_auth_path()
    files["HF token"] = hf_token.save_token("hf_" + "Q" * 34)
    store = ServiceConfigStore(state)
    store.write(ServiceConfig(None, ("json://u:Passw0rdXYZ@example.org/hook?token=T0kenXYZ",)))
    files["service.json (Apprise URLs)"] = store.path
    keys = KeyStore(state)
    try:
        keys.create("ci")
        db_files = [keys.path, *(keys.path.with_name(keys.path.name + s) for s in ("-wal", "-shm"))]
        open_modes = {p.name: oct(mode(p)) for p in db_files if p.exists()}  # checked while open: -wal/-shm live
        assert open_modes and all(m == "0o600" for m in open_modes.values()), open_modes
        files["gateway.sqlite (key hashes, request bodies)"] = keys.path
    finally:
        keys.close()
    files["an export"] = exports.write_export(state, "chat.md", "a conversation")
    src = state / "engine-run.log"
    src.write_text("engine log")
    files["an exported engine log"] = exports.copy_export(state, src, "engine.log")

    root = logging.getLogger()
    before, had = list(root.handlers), getattr(root, oplog._CONFIGURED, False)
    if had:
        delattr(root, oplog._CONFIGURED)
    try:
        oplog.configure(state, stream=io.StringIO())
        oplog.decision("panel", "started", who=oplog.CLI)
    finally:
        for h in [h for h in root.handlers if h not in before]:
            root.removeHandler(h)
            h.close()
        setattr(root, oplog._CONFIGURED, True) if had else None
    files["the operator's log"] = oplog.log_path(state)

    loose = {what: oct(mode(p)) for what, p in files.items() if mode(p) != 0o600}
    assert not loose, loose

    # the metrics token is the user's file: the panel refuses one others can read
    token = config / "metrics-token"
    token.write_text("x" * 40)
    token.chmod(0o644)
    with pytest.raises(MetricsTokenError, match="chmod 600"):
        load_token(token)
    token.chmod(0o600)
    assert load_token(token) == "x" * 40
