"""The containment check refuses every hostile member on its own (as on an interpreter without
PEP 706 filters), and the hf_token helpers keep the token private."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from app.backend.config import hf_token
from app.backend.download.safety import apply_data_filter, check_member
from app.backend.download.types import UnsafeArchiveError
from app.backend.simhub.artifacts import HOSTILE_KINDS, hostile_tar_bytes


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_own_check_alone_refuses(kind, tmp_path, monkeypatch):
    monkeypatch.delattr(tarfile, "data_filter", raising=False)  # like Debian's 3.11.2
    dest = os.path.realpath(tmp_path)
    with tarfile.open(fileobj=io.BytesIO(hostile_tar_bytes(kind))) as tf:
        members = tf.getmembers()
    check_member(members[0], dest)  # the harmless first member passes
    with pytest.raises(UnsafeArchiveError):
        for m in members[1:]:
            check_member(m, dest)
            if m.issym():  # materialise links so later members are judged against the real disk
                os.makedirs(os.path.dirname(os.path.join(dest, m.name)), exist_ok=True)
                os.symlink(m.linkname, os.path.join(dest, m.name))


def test_write_through_preexisting_escaping_link_is_refused(tmp_path):
    dest = tmp_path / "dest"
    (dest / "planescache").mkdir(parents=True)
    os.symlink("/tmp", dest / "planescache" / "sub")
    m = tarfile.TarInfo("planescache/sub/x.bin")
    with pytest.raises(UnsafeArchiveError, match="outside"):
        check_member(m, os.path.realpath(dest))


def test_fallback_filter_normalises_mode(tmp_path, monkeypatch):
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    m = tarfile.TarInfo("a")
    m.mode = 0o777
    assert apply_data_filter(m, str(tmp_path)).mode == 0o755


def test_token_resolution_order_and_save(tmp_path, monkeypatch):
    assert hf_token.resolve_token() is None
    Path(os.environ["HF_TOKEN_PATH"]).parent.mkdir(parents=True)
    Path(os.environ["HF_TOKEN_PATH"]).write_text("hf_fromHfFile000000\n")
    assert hf_token.resolve_token() == "hf_fromHfFile000000"
    saved = hf_token.save_token("hf_savedInPanel00000")
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert str(saved).startswith(os.environ["XDG_CONFIG_HOME"])
    assert hf_token.resolve_token() == "hf_savedInPanel00000"
    f = tmp_path / "tok"
    f.write_text("hf_fromFlagFile00000")
    assert hf_token.resolve_token(token_file=f) == "hf_fromFlagFile00000"
    monkeypatch.setenv("HF_TOKEN", "hf_fromEnv0000000000")
    assert hf_token.resolve_token(token_file=f) == "hf_fromFlagFile00000", "a flag beats the environment"
    assert hf_token.resolve_token() == "hf_fromEnv0000000000", "the environment beats the files"
    with pytest.raises(ValueError, match="--token-file"):
        hf_token.resolve_token(token_file=tmp_path / "missing")  # never a silent fall-through to HF_TOKEN
    assert hf_token.resolve_token("explicit-token-xyz") == "explicit-token-xyz"
    assert hf_token.redact("auth explicit-token-xyz and hf_fromEnv0000000000") == "auth hf_*** and hf_***"
    with pytest.raises(ValueError):
        hf_token.save_token("has space")
    assert hf_token.forget_saved_token() and not hf_token.has_saved_token()
