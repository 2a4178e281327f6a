"""app/backend/files/atomic.py: the atomic, durable file write and the pid lock the backend shares."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.backend.files import atomic as fileio
from app.backend.files.atomic import LockBusy, PidLock, atomic_write


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "journal.json"
    target.write_bytes(b"old")
    atomic_write(target, b"new" * 100_000, mode=0o600)
    assert target.read_bytes() == b"new" * 100_000
    assert target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.json"]


def test_a_failed_write_keeps_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "journal.json"
    target.write_bytes(b"old")
    calls = []

    def full_disk(fd: int, data: object) -> int:
        calls.append(fd)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio.os, "write", full_disk)
    with pytest.raises(OSError) as info:
        atomic_write(target, b"new")
    assert info.value.errno == errno.ENOSPC and calls
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["journal.json"]


HOLD = """
import sys, time
from pathlib import Path
from app.backend.files.atomic import PidLock
PidLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(60)
"""


def test_a_held_lock_names_its_holder_and_goes_with_its_process(tmp_path: Path) -> None:
    path = tmp_path / "sub" / ".lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LockBusy) as info:
            PidLock(path).acquire()
        assert info.value.holder == str(holder.pid)
    finally:
        holder.kill()  # kill -9: the kernel drops the flock with the process
        holder.wait()
    deadline = time.monotonic() + 10
    while True:
        try:
            with PidLock(path) as mine:
                assert path.read_text() == str(os.getpid()) and mine.path == path
            break
        except LockBusy:
            assert time.monotonic() < deadline, "the lock outlived its holder"
            time.sleep(0.05)
    PidLock(path).acquire(wait=True).release()  # free again once released


def test_a_note_names_the_holder_and_is_emptied_on_release(tmp_path: Path) -> None:
    path = tmp_path / "engine.lock"
    lock = PidLock(path).acquire(note='{"actor": "CLI"}')
    assert lock.held and PidLock(path).holder() == '{"actor": "CLI"}'
    with pytest.raises(LockBusy) as info:
        PidLock(path).acquire()
    assert info.value.holder == '{"actor": "CLI"}'
    lock.release()
    assert not lock.held and PidLock(path).holder() is None and path.read_text() == ""


def test_text_is_written_as_utf8_and_a_secret_is_never_looser_than_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "token"
    leftover = tmp_path / f".token.{os.getpid()}.{threading.get_ident()}.tmp"
    leftover.write_text("stale")
    leftover.chmod(0o666)  # a temporary left by a crash, world-readable
    atomic_write(target, "hf_é\n", mode=0o600)
    assert target.read_text(encoding="utf-8") == "hf_é\n" and target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token"]


def test_a_lock_whose_note_cannot_be_written_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the chaos soak's disk-full fault: the note's write failed with ENOSPC and the flock stayed taken
    by a descriptor nobody held, so every later start was refused until the panel ended."""
    import errno
    import os

    from app.backend.files.atomic import PidLock

    lock = PidLock(tmp_path / "engine.lock")
    real = os.pwrite

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError):
        lock.acquire()
    monkeypatch.setattr(os, "pwrite", real)
    assert not lock.held and lock.holder() is None  # nobody holds it: the next try can take it
    assert PidLock(tmp_path / "engine.lock").acquire().held
