"""One writer across processes: the engine operation lock (docs/engine.md, "One writer").

Every mutating operation (start, stop, switch with its rollback, the stall restart) holds an exclusive
`fcntl.flock` on `<state_dir>/engine.lock`, through the backend's one file lock (`fileio.PidLock`). The
kernel drops the lock when the holder's file is closed or its process dies (SIGKILL included), so a crashed
panel never leaves the box locked. The holder writes who it is into the file (pid, panel or CLI, operation,
since) so a refused writer can name it; the content is only trusted while the lock is actually held (a dead
holder's stale text is ignored).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from app.backend.files.atomic import LockBusy, PidLock

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
        self._lock = PidLock(self.path)
        self._mutex = threading.Lock()

    def acquire(self, actor: str, operation: str, profile: str = "") -> Holder:
        with self._mutex:
            if self._lock.held:
                raise LockHeld(self.holder())
            me = Holder(os.getpid(), actor, operation, time.time(), profile)
            try:
                self._lock.acquire(note=json.dumps(asdict(me)))
            except LockBusy as busy:
                raise LockHeld(_parse(busy.holder)) from None
            return me

    def release(self) -> None:
        with self._mutex:
            self._lock.release()

    def holder(self) -> Holder | None:
        """The current holder (any process), or None when nobody holds the lock. Read-only."""
        note = self._lock.holder()
        return _parse(note) if note is not None else None


def _parse(note: str) -> Holder | None:
    try:
        return Holder(**json.loads(note))
    except (ValueError, TypeError):
        return None  # nothing written yet (the holder is between its flock and its write), or not ours
