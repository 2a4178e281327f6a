"""The fd-ownership check (fdcheck.py) sees what it must: a close by another thread, EBADF, a reused number,
a leak; and a clean run of the downloader passes it (the `fd_check` fixture)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from app.backend.download import job
from app.backend.download.progress import ProgressBoard
from app.backend.download.runner import run_download
from app.backend.download.types import ArtifactState, Stopped

from .conftest import fast_config, run
from .fdcheck import fd_ownership
from .test_fd_stress import RUN_THREADS
from tests.polling import wait_for

HERE = str(Path(__file__).resolve().parent) + os.sep  # this file's opens are watched, as the downloader's are


def in_thread(fn) -> None:
    t = threading.Thread(target=fn)
    t.start()
    t.join(10)
    assert not t.is_alive()


def test_a_close_by_another_thread_is_foreign(tmp_path):
    with fd_ownership(fail=False, subject=HERE) as report:
        fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
        os.write(fd, b"x")
        in_thread(lambda: os.fstat(fd))
        in_thread(lambda: os.close(fd))
    assert len(report.foreign_closes) == 1 and "closed by another thread" in report.foreign_closes[0]
    assert len(report.foreign_uses) == 1 and "os.fstat" in report.foreign_uses[0]
    assert not report.ebadf and not report.leaked


def test_a_double_close_is_ebadf_and_a_close_of_an_fd_not_opened_here_is_foreign(tmp_path):
    other = open(tmp_path / "g", "wb")  # noqa: SIM115 - its fd is closed under it below, on purpose
    with fd_ownership(fail=False, subject=HERE) as report:
        fd = os.open(tmp_path / "f", os.O_RDONLY | os.O_CREAT)
        os.close(fd)
        try:
            os.close(fd)
        except OSError:
            pass
        os.close(other.fileno())
    assert len(report.ebadf) == 1 and "Bad file descriptor" in report.ebadf[0]
    assert len(report.foreign_closes) == 2, report.foreign_closes  # the second close and the file's fd
    try:
        other.close()
    except OSError:
        pass


def test_a_number_closed_elsewhere_and_reused_is_caught_and_a_leak_is_reported(tmp_path):
    with fd_ownership(fail=False, subject=HERE) as report:
        fd = os.open(tmp_path / "f", os.O_RDONLY | os.O_CREAT)
        os.closerange(fd, fd + 1)  # closed behind the check's back
        with open(tmp_path / "g", "wb") as f:
            assert f.fileno() == fd, "the kernel reuses the lowest free number"
            os.close(fd)  # now another file's
            try:
                f.close()
            except OSError:
                pass
        leak = os.open(tmp_path / "h", os.O_RDONLY | os.O_CREAT)
    assert len(report.reused) == 1 and "another file" in report.reused[0]
    assert len(report.leaked) == 1 and f"fd {leak}" in report.leaked[0]


def test_the_check_raises_at_the_end_of_its_block(tmp_path):
    try:
        with fd_ownership(subject=HERE):
            fd = os.open(tmp_path / "f", os.O_RDONLY | os.O_CREAT)
            in_thread(lambda: os.close(fd))
    except AssertionError as exc:
        assert "1 foreign closes" in str(exc)
    else:
        raise AssertionError("the check did not fail")


def test_a_clean_download_passes_the_check(settings, hub, artifact, tmp_path, fd_check):
    board = run(settings, hub.endpoint, tmp_path / "dest")
    assert board.snapshot()[0].state == ArtifactState.DONE
    assert fd_check.opens > 20 and fd_check.closes == fd_check.opens


def test_a_worker_that_does_not_stop_is_an_error_and_nothing_is_closed_under_it(settings, hub, tmp_path, monkeypatch,
                                                                               oplog_lines):
    """A fetch worker stuck past the join's deadline: the run ends all the same, the operator's log says which
    thread, and its fd stays open until the worker itself lets go (docs/downloads.md, "File descriptors")."""
    monkeypatch.setattr(job, "JOIN_GRACE_S", 0.2)
    real, stuck, release = job.fetch_range, threading.Event(), threading.Event()

    def fetch_range(*args, **kw):
        if not stuck.is_set():
            stuck.set()
            release.wait(60)  # deaf to the run's stop, holding its fd
        return real(*args, **kw)

    monkeypatch.setattr(job, "fetch_range", fetch_range)
    stop = threading.Event()
    with fd_ownership() as report:
        threading.Thread(target=lambda: stuck.wait(30) and stop.set()).start()
        try:
            run_download(fast_config(settings, hub.endpoint, tmp_path / "dest"), list(settings.recipe.artifacts),
                         ProgressBoard(), stop)
        except Stopped:
            pass
        finally:
            held_open = report.opens - report.closes  # the stuck worker's, still open as the run returns
            release.set()
        wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith(RUN_THREADS)], 20.0,
                 "the stuck worker to end once released")
    assert stuck.is_set() and stop.is_set()
    assert held_open, "the stuck worker's fd was closed under it"
    line = next(ln for ln in oplog_lines.getvalue().splitlines() if "threads-stuck" in ln)
    assert "component=downloads" in line and "threads=fetch-" in line, line
