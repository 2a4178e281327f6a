"""Fault matrix against the SIMULATED hub: every transient fault ends in a byte-identical tree."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from app.backend.download.ckpt import check_ckpt_id
from app.backend.download.progress import ProgressBoard
from app.backend.download.runner import run_download
from app.backend.download.types import ArtifactState, CorruptPartError
from app.backend.simhub.artifacts import file_digest_tree
from app.backend.simhub.faults import Fault

from .conftest import PREFIX, fast_config
from tests.polling import wait_for

PART1 = PREFIX + "001"


def download(settings, hub, dest: Path, **kw) -> ProgressBoard:
    board = ProgressBoard()
    run_download(fast_config(settings, hub.endpoint, dest, **kw), list(settings.recipe.artifacts), board,
                 threading.Event())
    return board


def test_clean_download_matches_reference_tar(settings, hub, artifact, tmp_path):
    dest = tmp_path / "dest"
    board = download(settings, hub, dest)
    [a] = board.snapshot()
    assert a.state == ArtifactState.DONE
    assert a.verified_bytes == sum(p.stat().st_size for p in artifact.parts)
    assert file_digest_tree(dest) == artifact.reference
    assert hub.stats.requests[("info", "moet-panel/simulated-cache")] == 1, "one listing answer pins commit + sha256s"
    assert hub.stats.auth_on_cdn == 0
    check = check_ckpt_id(settings, dest)
    assert check.status == "match", check.message


def test_sparse_file_stays_sparse(settings, hub, tmp_path):
    dest = tmp_path / "dest"
    download(settings, hub, dest)
    [sparse] = list(dest.rglob("sparse.pool.bin"))
    st = os.stat(sparse)
    assert st.st_size == 32 << 20
    assert st.st_blocks * 512 < 1 << 20, f"holes were filled: {st.st_blocks * 512} bytes allocated"


# the transient faults of the matrix (test_fd_stress.py runs them again under the fd check)
TRANSIENT_FAULTS = [
    Fault("drop", after_bytes=100_000),
    Fault("reset", after_bytes=50_000),
    Fault("truncate", after_bytes=70_000),
    Fault("status", status=503, times=3),
    Fault("status", status=500, where="resolve", times=2),
    Fault("ratelimit", retry_after=1),
    Fault("ratelimit", retry_after=1, where="info"),
    Fault("stall", after_bytes=10_000, stall_s=20),
    Fault("ignore_range", times=2),
    Fault("corrupt", offset=200_000),
]


@pytest.mark.parametrize("fault", TRANSIENT_FAULTS, ids=lambda f: f"{f.kind}-{f.where}")
def test_transient_fault_is_survived(settings, hub, artifact, tmp_path, fault):
    # a copy: the hub consumes a fault's `times`, and the fd stress test runs the same faults again
    fault = replace(fault)
    key = "__info__" if fault.where == "info" else PART1
    hub.add_fault(key, fault)
    board = download(settings, hub, tmp_path / "dest")
    assert fault.hits >= 1, "the fault never fired: the test proves nothing"
    [a] = board.snapshot()
    assert a.state == ArtifactState.DONE, a.reason
    assert file_digest_tree(tmp_path / "dest") == artifact.reference
    if fault.kind in ("drop", "reset", "stall", "truncate"):
        starts = [int(r.split("=")[1].split("-")[0]) for p, r in hub.stats.ranges if p == PART1]
        assert any(s % (128 * 1024) == fault.after_bytes for s in starts), f"no resumed Range in {starts}"
    if fault.kind == "corrupt":
        assert any(e.__class__.__name__ == "PartRetry" and "sha256" in e.reason for e in board.events)
        assert a.verify_failures == 1  # counted for /metrics (docs/metrics.md)


def test_drop_resumes_with_range_from_the_first_missing_byte(settings, hub, tmp_path):
    hub.add_fault(PART1, Fault("drop", after_bytes=100_000))
    download(settings, hub, tmp_path / "dest", segment_size=512 * 1024)
    ranges = [r for p, r in hub.stats.ranges if p == PART1]
    assert "bytes=100000-524287" in ranges, ranges


def test_persistent_corruption_fails_naming_the_part(settings, hub, tmp_path):
    hub.add_fault(PART1, Fault("corrupt", offset=1000, times=-1))
    board = ProgressBoard()
    cfg = fast_config(settings, hub.endpoint, tmp_path / "dest", corrupt_refetches=2)
    with pytest.raises(CorruptPartError) as err:
        run_download(cfg, list(settings.recipe.artifacts), board, threading.Event())
    assert PART1 in str(err.value) and "sha256" in str(err.value)
    [a] = board.snapshot()
    assert a.state == ArtifactState.FAILED and PART1 in a.reason
    assert hub.stats.cdn_requests(PART1) >= 3, "refetched before giving up"
    # verify-before-trust: the corrupt part never became "verified", so nothing extracted from it landed
    journal = json.loads((tmp_path / "dest/.moet-panel/downloads/planescache.json").read_text())
    status = {p["name"]: p["status"] for p in journal["parts"]}
    assert status[PART1] == "pending"
    assert a.parts_verified < a.parts_total
    assert a.verify_failures == 3  # the first fetch and both refetches, counted for /metrics


@pytest.mark.parametrize("slice_bytes", [8 << 20, 5000])
def test_a_part_hashed_in_pieces_as_its_segments_arrive_hashes_as_a_whole(tmp_path, monkeypatch, slice_bytes):
    """The verifier hashes each run of segments as it arrives (job._hash_range, one mapping per slice); any
    split, page-aligned or not, must give the whole file's sha256."""
    import hashlib

    from app.backend.download import job
    from app.backend.download.job import _hash_range

    monkeypatch.setattr(job, "HASH_SLICE", slice_bytes)

    data = bytes(range(256)) * 4099  # not a multiple of the page size
    path = tmp_path / "part"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        for cuts in ([0, len(data)], [0, 4096, 3 * 4096, len(data)], [0, 1, 5000, 777777, len(data)]):
            h = hashlib.sha256()
            for start, end in zip(cuts, cuts[1:], strict=False):
                _hash_range(h, fd, start, end, threading.Event())
            assert h.hexdigest() == hashlib.sha256(data).hexdigest(), cuts
    finally:
        os.close(fd)


@contextmanager
def downloading(settings, hub, dest: Path) -> Iterator[ProgressBoard]:
    """run_download in a thread for the block; waits for it to end (the block releases what it holds)."""
    board, errors = ProgressBoard(), []

    def work() -> None:
        try:
            run_download(fast_config(settings, hub.endpoint, dest), list(settings.recipe.artifacts), board,
                         threading.Event())
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    try:
        yield board
    finally:
        hub.faults.clear()
        worker.join(60)
    assert not worker.is_alive() and not errors, errors


def hold_last_segment(hub, artifact) -> tuple[str, int]:
    """The last part's last segment trickles until the test clears the faults (1 byte, then a dropped
    connection, again and again): every byte before it can arrive, that part cannot verify."""
    last = artifact.parts[-1]
    # covering its last byte: each resumed range (one byte further on) still includes it
    hub.add_fault(last.name, Fault("stall", times=-1, after_bytes=1, stall_s=0.2, covering=last.stat().st_size - 1))
    return last.name, sum(p.stat().st_size for p in artifact.parts[:-1])


def landed(dest: Path) -> list[Path]:
    return [p for p in dest.rglob("*") if p.is_file() and ".moet-panel" not in p.parts
            and not p.name.endswith(".moet-partial")]


def test_a_part_is_decoded_as_it_arrives_and_lands_only_once_verified(settings, hub, artifact, tmp_path,
                                                                     monkeypatch):
    """The extractor reads a part's segments as they arrive, before its sha256 is known; what it writes
    from them stays in temp files until the part verifies (docs/downloads.md, "Decoded as it arrives")."""
    from app.backend.download import extract

    monkeypatch.setattr(extract, "DECODE_CHUNK", 64 * 1024)  # decoded buffers smaller than the part's first segments
    dest = tmp_path / "dest"
    held, before = hold_last_segment(hub, artifact)
    seg = fast_config(settings, hub.endpoint, dest).segment_size
    with downloading(settings, hub, dest) as board:
        # a whole segment of the held part read (its bytes are read as they land: one byte is not enough to decode)
        wait_for(lambda: board.snapshot() and board.snapshot()[0].decoded_bytes >= before + seg, 20.0,
                   "the extractor never read into the part still arriving")
        wait_for(lambda: board.snapshot()[0].parts_verified == len(artifact.parts) - 1, 20.0,
                   "every part but the held one verifies")
        # what depends on the unverified part waits in temp files; every file before it may have landed
        wait_for(lambda: list(dest.rglob("*.moet-partial")), 20.0, "nothing was written ahead, waiting to land")
        assert board.snapshot()[0].parts_verified == len(artifact.parts) - 1, "the held part is not verified"
        partial_names = {p.name.removeprefix(".").removesuffix(".moet-partial") for p in dest.rglob("*.moet-partial")}
        assert not partial_names & {p.name for p in landed(dest)}
    [a] = board.snapshot()
    assert a.state == ArtifactState.DONE, a.reason
    assert file_digest_tree(dest) == artifact.reference
    assert not list(dest.rglob("*.moet-partial"))


def test_a_segment_is_read_as_it_lands_not_once_it_is_whole(settings, hub, artifact, tmp_path):
    """The range holding the first part's first byte sends 16 KiB, then nothing until the test clears the faults:
    the extractor decodes those bytes meanwhile, where it used to wait for the whole segment, and reads nothing
    past them, though the ranges after them land (docs/downloads.md, "Read as it lands"). Nothing lands before
    the part verifies; the tree is the reference's."""
    first = artifact.parts[0]
    hub.add_fault(first.name, Fault("stall", times=1, after_bytes=16 * 1024, covering=0))
    # its resumed range (from the first byte it lacks) stalls too, until the faults are cleared
    hub.add_fault(first.name, Fault("stall", times=-1, after_bytes=0, stall_s=2.0, covering=16 * 1024))
    dest = tmp_path / "dest"
    with downloading(settings, hub, dest) as board:
        wait_for(lambda: board.snapshot() and board.snapshot()[0].decoded_bytes > 0, 20.0,
                   "the extractor waited for the whole first range")
        a = board.snapshot()[0]
        assert a.decoded_bytes <= 16 * 1024, "only the landed prefix was read (the extractor reads in order)"
        assert not landed(dest), "nothing lands before its part verifies"
    [a] = board.snapshot()
    assert a.state == ArtifactState.DONE, a.reason
    assert file_digest_tree(dest) == artifact.reference


def test_a_part_read_ahead_that_fails_sha256_voids_what_was_decoded_and_extraction_starts_again(
        settings, hub, artifact, tmp_path):
    """A corrupt byte in a part the extractor has already read: nothing decoded from it lands, the part is
    fetched again, and extraction starts again from the first part; the tree is the reference's."""
    dest = tmp_path / "dest"
    held, before = hold_last_segment(hub, artifact)
    hub.add_fault(held, Fault("corrupt", offset=100))  # in its first segment, served once
    with downloading(settings, hub, dest) as board:
        wait_for(lambda: board.snapshot() and board.snapshot()[0].decoded_bytes > before, 20.0,
                   "the extractor never read into the corrupt part")
        assert not any(held in str(p) for p in landed(dest))
    [a] = board.snapshot()
    assert a.state == ArtifactState.DONE, a.reason
    assert file_digest_tree(dest) == artifact.reference
    assert any(e.__class__.__name__ == "PartRetry" and "sha256" in e.reason for e in board.events)
    assert any("starts again from the first part" in getattr(e, "message", "") for e in board.events)
    assert a.decoded_bytes == a.total_bytes, "the decoded count starts again with the extraction"
    assert not list(dest.rglob("*.moet-partial"))
