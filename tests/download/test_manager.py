"""The panel's DownloadManager (state.downloads): start / pause / resume / double click / clean,
and the progress board's honest "stalled" flag."""

from __future__ import annotations


import pytest

from tests.polling import wait_for
from app.backend.contracts import size_pair_text
from app.backend.download.manager import DownloadManager
from app.backend.download.progress import ProgressBoard
from app.backend.download.statemachine import (
    ArtifactStatus, Began, Completed, IllegalTransition, Paused, restored, transition,
)
from app.backend.download.types import ArtifactProgress, ArtifactState, Limit

from .conftest import start_hub


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
        # /metrics' counters (docs/metrics.md): bytes received over both runs (the paused one retired into
        # the process total), every part verified, no sha256 failure
        [c] = mgr.counters()
        total = sum(p.stat().st_size for p in artifact.parts)
        assert c.state == ArtifactState.DONE and c.parts_verified == c.parts_total == len(artifact.parts)
        assert c.received_bytes >= total and c.verify_failures == 0
        assert "removed" in mgr.clean()
        assert mgr.counters()[0].received_bytes == c.received_bytes  # clean retires the board, keeps the count
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


def test_rows_before_start_cancel_and_resume_say_what_happened(settings, artifact):
    from app.ui.downloads import artifacts_html

    hub = start_hub(artifact, rate_cap_bps=150_000)
    mgr = DownloadManager(settings, endpoint=hub.endpoint, connections=2, segment_size=256 * 1024)
    compressed = sum(p.stat().st_size for p in artifact.parts)
    try:
        # before Start: the listed size, not 0 / 0 (listed once in the background)
        wait_for(lambda: mgr.snapshot().artifacts[0].total_bytes == compressed, what="the listed size")
        page = artifacts_html(mgr.snapshot())
        assert size_pair_text(0, compressed) in page  # in the total's unit, not "0.00 GiB / 0.003 GiB" (issue 49)
        mgr.start()
        wait_for(lambda: mgr.snapshot().artifacts[0].verified_bytes > 0, what="first verified part")
        assert mgr.cancel().startswith("cancelled")
        [row] = mgr.snapshot().artifacts
        assert row.state == ArtifactState.CANCELLED and row.eta_s is None
        page = artifacts_html(mgr.snapshot())
        assert ">cancelled<" in page
        # a stopped row's bar shows what is kept (verified parts), not the unverified bytes fetched before it
        assert f'class="fetched" style="width:{100 * row.verified_bytes / row.total_bytes:.1f}%"' in page
        wire_before = row.wire_bytes
        hub.rate_cap_bps = None
        assert mgr.resume() == "download started"
        seen = [wire_before]

        def finished() -> bool:  # the wire counter never goes back after Resume (issue 49), polled to the end
            seen.append(mgr.snapshot().artifacts[0].wire_bytes)
            return not mgr.running

        wait_for(finished, what="completion")
        assert all(b >= a for a, b in zip(seen, seen[1:], strict=False)), seen
        [row] = mgr.snapshot().artifacts
        assert row.state == ArtifactState.DONE and row.reused_parts >= 1
        began = [e for e in mgr._board.events if getattr(e, "state", None) == ArtifactState.DOWNLOADING]
        assert began and f"reuses {row.reused_parts} of {row.parts_total} parts" in began[0].reason
    finally:
        mgr.close()
        hub.stop()


def test_a_paused_or_idle_row_has_no_eta():
    now = [0.0]
    board = ProgressBoard(clock=lambda: now[0])
    board.register(ArtifactProgress(id="a", total_bytes=1000))
    board.apply("a", Began())
    board.add_wire("a", 100)
    board.add_fetched("a", 100)
    now[0] = 1.0
    board.snapshot()
    board.add_wire("a", 100)
    board.add_fetched("a", 100)
    now[0] = 2.0
    running = board.snapshot()[0]
    assert running.eta_s is not None and running.eta_s > 0 and running.binding == Limit.NETWORK
    board.apply("a", Paused("paused; Resume continues where it stopped"))
    now[0] = 3.0
    paused = board.snapshot()[0]
    assert paused.eta_s is None and paused.rate_bps == 0.0 and paused.binding is None


def test_illegal_moves_raise_and_a_killed_run_reads_as_paused():
    with pytest.raises(IllegalTransition):
        transition(ArtifactStatus(ArtifactState.DONE), Paused("x"))
    with pytest.raises(IllegalTransition):
        transition(ArtifactStatus(ArtifactState.QUEUED), Completed())
    assert restored(ArtifactState.EXTRACTING, "").state == ArtifactState.PAUSED
    assert restored(ArtifactState.DONE, "").state == ArtifactState.DONE
    assert ArtifactState.parse("nonsense") == ArtifactState.QUEUED


def test_binding_limit_reads_where_the_extractor_waited():
    now = [0.0]
    board = ProgressBoard(clock=lambda: now[0])
    board.register(ArtifactProgress(id="a", total_bytes=1000))
    board.apply("a", Began())
    board.snapshot()
    board.add_decoded("a", 10)
    board.waited("a", Limit.DISK, 0.8)  # the decoder waited for the writer most of the second
    board.waited("a", Limit.DECODE, 0.1)
    now[0] = 1.0
    assert board.snapshot()[0].binding == Limit.DISK
    board.waited("a", Limit.DECODE, 0.9)  # now the writer waits on the decoder
    now[0] = 2.0
    board.snapshot()
    now[0] = 7.5  # the old samples leave the window
    board.waited("a", Limit.DECODE, 4.0)
    assert board.snapshot()[0].binding == Limit.DECODE
    board.waited("a", Limit.HASH, 3.0)
    now[0] = 12.0
    assert board.snapshot()[0].binding == Limit.HASH


def test_resume_on_a_finished_download_says_so_not_an_internal_error(settings, artifact):
    """Issue 42: Resume (or Start) on a download already complete showed "Error: internal error: ValueError:
    max_workers must be greater than 0" (a thread pool for zero artifacts), kept for every later visitor."""
    hub = start_hub(artifact)
    mgr = DownloadManager(settings, endpoint=hub.endpoint, connections=2, segment_size=256 * 1024)
    try:
        assert mgr.start() == "download started"
        wait_for(lambda: not mgr.running, what="completion")
        assert mgr.snapshot().artifacts[0].state == ArtifactState.DONE
        assert mgr.resume() == "download started"
        wait_for(lambda: not mgr.running, what="the second run's end")
        snap = mgr.snapshot()
        assert snap.error == "", snap.error
        assert "complete and verified" in snap.message
        assert snap.artifacts[0].state == ArtifactState.DONE
    finally:
        mgr.close()
        hub.stop()
