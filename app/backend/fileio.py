"""Two file primitives the backend needs in several places, written once: a file replaced atomically and
durably (`atomic_write`), and a lock a process holds on a file with its pid in it (`PidLock`)."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data`: a temporary file beside it, fsynced, renamed over it, and the folder
    fsynced, so after a crash the file is the old one or the new one, never half of one.

    Raises:
        OSError: the write failed (ENOSPC / EDQUOT included); the old file is intact, no temporary is left.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                if written <= 0:
                    raise OSError(errno.ENOSPC, "short write")
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # a folder that cannot be opened (e.g. no read permission): the rename stands unsynced
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a folder
    finally:
        os.close(fd)


class LockBusy(Exception):
    """Another process holds the lock; `holder` is what it wrote into the file (its pid, or '')."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


class PidLock:
    """An exclusive `fcntl.flock` on `path`, holding this process's pid for whoever finds it taken.

    The kernel drops the lock when the descriptor is closed or the process dies (kill -9 included), so a
    stale file never blocks anyone."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, *, wait: bool = False) -> PidLock:
        """Take the lock; with `wait`, until the holder lets go.

        Raises:
            LockBusy: held by another process (only without `wait`).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip()
            os.close(fd)
            raise LockBusy(holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing drops the flock

    def __enter__(self) -> PidLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
