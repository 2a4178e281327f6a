"""The panel's DownloadManager (state.downloads): start / pause / resume / double click / clean,
and the progress board's honest "stalled" flag."""

from __future__ import annotations

import time

from app.backend.download.manager import DownloadManager
from app.backend.download.progress import ProgressBoard
from app.backend.download.types import ArtifactProgress, ArtifactState

from .conftest import start_hub


def wait_for(pred, timeout=30.0, what=""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_pause_resume_and_double_click(settings, artifact):
    hub = start_hub(artifact, rate_cap_bps=200_000)
    mgr = DownloadManager(settings, endpoint=hub.endpoint, connections=2, segment_size=256 * 1024)
    try:
        assert "listed" in mgr.refresh()
        assert mgr.rows()[0].parts == len(artifact.parts)
        assert mgr.start() == "download started"
        assert mgr.start() == "a download is already running"  # double click changes nothing
        wait_for(lambda: mgr.snapshot().artifacts[0].verified_bytes > 0, what="first verified part")
        assert "paused" in mgr.pause()
        snap = mgr.snapshot()
        assert not snap.running and snap.artifacts[0].state == ArtifactState.PAUSED
        verified_before = snap.artifacts[0].verified_bytes
        hub.rate_cap_bps = None
        assert mgr.resume() == "download started"
        wait_for(lambda: not mgr.running, what="completion")
        snap = mgr.snapshot()
        assert snap.artifacts[0].state == ArtifactState.DONE, (snap.error, snap.artifacts[0].reason)
        assert snap.artifacts[0].verified_bytes >= verified_before
        assert mgr.ckpt_check().status == "match"
        assert "removed" in mgr.clean()
        assert (settings.data_dir / "planescache").is_dir(), "clean keeps completed artifacts"
    finally:
        mgr.close()
        hub.stop()


def test_bad_endpoint_error_is_shown_not_raised(settings):
    mgr = DownloadManager(settings, endpoint="http://127.0.0.1:9", connections=1, api_attempts=1)
    try:
        mgr.start()
        wait_for(lambda: not mgr.running, what="failure")
        assert "cannot reach the Hub" in mgr.snapshot().error
    finally:
        mgr.close()


def test_stalled_means_open_requests_and_no_bytes():
    now = [0.0]
    board = ProgressBoard(clock=lambda: now[0])
    board.register(ArtifactProgress(id="a", state=ArtifactState.DOWNLOADING, total_bytes=100))
    board.flight("a", +1)
    now[0] = 1.0
    assert not board.snapshot()[0].stalled
    now[0] = 4.5
    snap = board.snapshot()[0]
    assert snap.stalled and snap.rate_bps == 0.0
    board.add_wire("a", 10)
    board.add_fetched("a", 10)
    assert not board.snapshot()[0].stalled
    board.flight("a", -1)
    now[0] = 20.0
    assert not board.snapshot()[0].stalled, "waiting for the extractor is not a stall"
