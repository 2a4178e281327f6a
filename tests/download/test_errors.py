"""Clear errors: auth, wrong repo/revision, hostile archives, lock, disk space; the token never leaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.backend.download.journal import DestLock
from app.backend.download.progress import ProgressBoard
from app.backend.download.types import AuthError, LockedError, NotFoundError, SpaceError, UnsafeArchiveError
from app.backend.simhub.artifacts import HOSTILE_KINDS, build_hostile_artifact
from app.backend.simhub.faults import Fault
from app.backend.simhub.server import SimHub

from .conftest import KNOWN_TOKEN, PREFIX, fast_config, run



def test_missing_token_says_how_to_provide_one(settings, private_hub, tmp_path):
    with pytest.raises(AuthError) as err:
        run(settings, private_hub.endpoint, tmp_path / "d")
    assert "401" in str(err.value) and "HF_TOKEN" in str(err.value)


def test_bad_token_is_rejected_clearly_and_not_echoed(settings, private_hub, tmp_path):
    bad = "hf_WrongTokenWrongToken000000"
    with pytest.raises(AuthError) as err:
        run(settings, private_hub.endpoint, tmp_path / "d", token=bad)
    assert "401" in str(err.value) and "rejected" in str(err.value)
    assert bad not in str(err.value)


def test_good_token_goes_to_the_hub_only(settings, private_hub, artifact, tmp_path):
    run(settings, private_hub.endpoint, tmp_path / "d", token=KNOWN_TOKEN)
    assert private_hub.stats.auth_on_cdn == 0, "token forwarded to the CDN host"
    assert f"Bearer {KNOWN_TOKEN}" in private_hub.stats.auth_headers


def test_gated_repo_is_403_with_what_to_do(settings, artifact, tmp_path):
    h = SimHub()
    h.add_repo("moet-panel/simulated-cache", artifact.files, gated=True)
    with h.start():
        with pytest.raises(AuthError) as err:
            run(settings, h.endpoint, tmp_path / "d", token=KNOWN_TOKEN)
    assert "403" in str(err.value) and "gated" in str(err.value)


def test_wrong_repo_and_revision_are_404(settings, hub, tmp_path):
    with pytest.raises(NotFoundError) as err:
        run(settings, hub.endpoint, tmp_path / "d", repo="nobody/nothing", recipe_repo=False)
    assert "nobody/nothing" in str(err.value) and "--repo" in str(err.value)
    with pytest.raises(NotFoundError) as err:
        run(settings, hub.endpoint, tmp_path / "d", revision="v9")
    assert "revision 'v9'" in str(err.value)


def test_other_repo_uses_compressed_size_times_factor(settings, artifact, tmp_path):
    h = SimHub()
    h.add_repo("mirror/copy", artifact.files)
    with h.start():
        board = ProgressBoard()
        run(settings, h.endpoint, tmp_path / "d", board=board, repo="mirror/copy", recipe_repo=False)
    [a] = board.snapshot()
    assert a.estimate == int(a.total_bytes * 3.0)
    assert a.state.value == "done"


@pytest.mark.parametrize("kind", HOSTILE_KINDS)
def test_hostile_archive_is_refused(settings, kind, tmp_path):
    repo = tmp_path / "repo"
    parts = build_hostile_artifact(kind, repo, PREFIX)
    h = SimHub()
    h.add_repo("moet-panel/simulated-cache", {p.name: p for p in parts})
    dest = tmp_path / "inner" / "dest"
    with h.start():
        board = ProgressBoard()
        with pytest.raises(UnsafeArchiveError) as err:
            run(settings, h.endpoint, dest, board=board)
    assert "refused" in str(err.value)
    [a] = board.snapshot()
    assert a.state.value == "failed"
    assert not Path("/tmp/moet-panel-evil.txt").exists()
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "inner" / "evil.txt").exists()
    for p in dest.rglob("*"):
        assert not (p.is_file() and p.stat().st_mode & 0o6000), f"setuid file extracted: {p}"
        assert not p.is_char_device() and not p.is_block_device()


def test_second_download_on_same_dest_refuses(settings, hub, tmp_path):
    dest = tmp_path / "d"
    with DestLock(dest):
        with pytest.raises(LockedError) as err:
            run(settings, hub.endpoint, dest)
    assert "already using" in str(err.value)


def test_preflight_refuses_with_numbers(settings, hub, tmp_path):
    with pytest.raises(SpaceError) as err:
        run(settings, hub.endpoint, tmp_path / "d", reserve_bytes=1 << 50)
    assert "GiB" in str(err.value) and "free" in str(err.value)


def test_token_never_leaks_into_journal_events_or_errors(settings, private_hub, tmp_path):
    private_hub.add_fault(PREFIX + "001", Fault("status", status=503, times=2))
    private_hub.add_fault(PREFIX + "002", Fault("drop", after_bytes=1000))
    board = ProgressBoard()
    dest = tmp_path / "d"
    run(settings, private_hub.endpoint, dest, board=board, token=KNOWN_TOKEN)
    texts = [repr(e) for e in board.events] + [repr(a) for a in board.snapshot()]
    texts += [p.read_text(errors="replace") for p in (dest / ".moet-panel").rglob("*.json")]
    with pytest.raises(AuthError) as err:
        run(settings, private_hub.endpoint, tmp_path / "e", token=KNOWN_TOKEN + "x")
    texts.append(str(err.value))
    assert texts and not any(KNOWN_TOKEN in t for t in texts)
    cfg = fast_config(settings, private_hub.endpoint, dest, token=KNOWN_TOKEN)
    assert KNOWN_TOKEN not in repr(cfg)
    journal = json.loads((dest / ".moet-panel/downloads/planescache.json").read_text())
    assert journal["state"] == "done"
