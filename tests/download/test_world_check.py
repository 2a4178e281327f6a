"""The Downloads view re-checks the world, not only the journal (issue 29: "all complete and verified" after
the extracted folder was moved away): a moved folder or a missing ckpt pin file is named with its fix, and
Start downloads and extracts it again."""

from __future__ import annotations

import shutil

from app.backend.download.manager import DownloadManager
from app.backend.download.types import ArtifactState
from app.ui.downloads import idle_text

from .conftest import start_hub
from tests.polling import wait_for


def _complete(mgr: DownloadManager) -> None:
    assert mgr.start() == "download started"
    wait_for(lambda: not mgr.running, timeout=60, what="completion")
    snap = mgr.snapshot()
    assert snap.artifacts[0].state is ArtifactState.DONE, (snap.error, snap.artifacts[0].reason)
    assert "complete and verified" in snap.message


def test_a_moved_folder_or_missing_pin_is_seen_and_start_fetches_it_again(settings, artifact, tmp_path) -> None:
    hub = start_hub(artifact)
    mgr = DownloadManager(settings, endpoint=hub.endpoint, connections=2, segment_size=256 * 1024)
    folder = settings.data_dir / "planescache"
    try:
        _complete(mgr)
        shutil.move(folder, tmp_path / "moved-away")
        snap = mgr.snapshot()
        row = snap.artifacts[0]
        assert row.state is not ArtifactState.DONE, row
        assert str(folder) in row.reason and "Start" in row.reason, row.reason
        assert "complete and verified" not in snap.message and "not on disk" in snap.message, snap.message
        assert "every artifact is downloaded" not in idle_text(snap)
        assert mgr.ckpt_check().status == "not_found"  # the pin check reads the disk again too

        _complete(mgr)  # Start downloads and extracts it again
        assert folder.is_dir() and mgr.ckpt_check().status == "match"

        for meta in folder.glob("v2/*/tp*-rank*/meta.json"):
            meta.unlink()  # the folder is there, the ckpt pin file is not
        row = mgr.snapshot().artifacts[0]
        assert row.state is not ArtifactState.DONE and "meta.json" in row.reason, row
        _complete(mgr)
        assert list(folder.glob("v2/*/tp*-rank*/meta.json")) and mgr.ckpt_check().status == "match"
    finally:
        mgr.close()
        hub.stop()
