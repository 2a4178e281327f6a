"""Two file primitives the backend needs in several places, written once: a file replaced atomically and
durably (`atomic_write`: journals, intent, settings, secrets, results, custom profiles), and an exclusive
lock a process holds on a file with a note in it for whoever finds it taken (`PidLock`: a download
destination, one artifact's run, the engine operation lock in engine/lifecycle/oplock.py)."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from pathlib import Path


def atomic_write(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    """Replace `path` with `data` (text is written as UTF-8): a temporary file beside it, fsynced, renamed
    over it, and the folder fsynced, so after a crash the file is the old one or the new one, never half of
    one. The file is never more open than `mode` (0o600 for secrets), at any moment; the umask still applies.

    Raises:
        OSError: the write failed (ENOSPC / EDQUOT included); the old file is intact, no temporary is left.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    # One temporary per writer (process and thread): two writers of one file never share a half-written one.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        try:
            current = stat.S_IMODE(os.fstat(fd).st_mode)
            if current & ~mode:  # a leftover temporary keeps its old mode through O_CREAT: tighten it
                os.fchmod(fd, current & mode)
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


def pid_alive(pid: int) -> bool:
    """Whether a process with this id runs (another user's process counts: it is alive, if not ours)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class LockBusy(Exception):
    """Another process holds the lock; `holder` is the note it wrote into the file (its pid, or '')."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


class PidLock:
    """An exclusive `fcntl.flock` on `path`, holding a note for whoever finds it taken: this process's pid
    unless the caller names itself otherwise (the engine lock writes who, what and since, as JSON).

    The kernel drops the lock when the descriptor is closed or the process dies (kill -9 included), so a
    stale file never blocks anyone; the note is only trusted while the lock is held (`holder`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """True while this instance holds the lock."""
        return self._fd is not None

    def acquire(self, *, wait: bool = False, note: str | None = None) -> PidLock:
        """Take the lock and write `note` (default: this pid) into the file; with `wait`, until the holder
        lets go.

        Raises:
            LockBusy: held by another process or another instance (only without `wait`).
            OSError: the note could not be written (a full disk); the lock is not held then.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip()
            os.close(fd)
            raise LockBusy(holder) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (str(os.getpid()) if note is None else note).encode(), 0)
        except OSError:  # a full disk (ENOSPC): let go, or this process would hold the lock, noteless, until it ends
            os.close(fd)
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        """Let go; the note is emptied first, so no reader finds a stale one."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)  # closing drops the flock

    def holder(self) -> str | None:
        """The holder's note (any process, this one included), or None when nobody holds the lock. Read-only:
        a shared lock is tried, never kept."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                return None  # nobody holds it: any text in the file is stale
            except BlockingIOError:
                pass
            return os.pread(fd, 4096, 0).decode(errors="replace").strip()
        finally:
            os.close(fd)

    def __enter__(self) -> PidLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
