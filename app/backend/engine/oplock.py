"""One writer across processes: the engine operation lock (docs/engine.md, "One writer").

Every mutating operation (start, stop, switch with its rollback, the stall restart) holds an exclusive
`fcntl.flock` on `<state_dir>/engine.lock`. The kernel drops the lock when the holder's file is closed or
its process dies (SIGKILL included), so a crashed panel never leaves the box locked. The holder writes who
it is into the file (pid, panel or CLI, operation, since) so a refused writer can name it; the content is
only trusted while the lock is actually held (a dead holder's stale text is ignored).
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

LOCK_NAME = "engine.lock"


@dataclass(frozen=True)
class Holder:
    """Who holds the engine lock."""

    pid: int
    actor: str  # "panel" or "CLI"
    operation: str  # start | stop | switch | restart
    since: float
    profile: str = ""

    def describe(self) -> str:
        what = f"{self.operation} to {self.profile}" if self.profile else self.operation
        stamp = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"{self.actor} pid {self.pid} ({what}, since {stamp})"


class LockHeld(RuntimeError):
    """Another writer holds the engine lock; `holder` names it (None when it wrote nothing yet)."""

    def __init__(self, holder: Holder | None) -> None:
        who = holder.describe() if holder else "another process (identity not written yet)"
        super().__init__(f"refused: the engine is being changed by {who} — wait for it to finish")
        self.holder = holder


class EngineLock:
    """Non-blocking exclusive lock; one instance per controller. `acquire` raises LockHeld."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / LOCK_NAME
        self._fd: int | None = None
        self._mutex = threading.Lock()

    def acquire(self, actor: str, operation: str, profile: str = "") -> Holder:
        with self._mutex:
            if self._fd is not None:
                raise LockHeld(self.holder())
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise LockHeld(self.holder()) from None
            me = Holder(os.getpid(), actor, operation, time.time(), profile)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(asdict(me)).encode(), 0)
            self._fd = fd
            return me

    def release(self) -> None:
        with self._mutex:
            fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)  # no stale identity for readers
        except OSError:
            pass
        os.close(fd)  # closing drops the flock

    @property
    def held_here(self) -> bool:
        return self._fd is not None

    def holder(self) -> Holder | None:
        """The current holder (any process), or None when nobody holds the lock. Read-only."""
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
            raw = os.pread(fd, 4096, 0)
        finally:
            os.close(fd)
        try:
            return Holder(**json.loads(raw.decode()))
        except (ValueError, TypeError):
            return None
