"""What the artifacts of one run share across processes: the connection budget, the disk and a stop.

Everything here is a multiprocessing primitive, so a child process running one artifact (procs.py) gets
the same group (docs/downloads.md, "What crosses between processes").
"""

from __future__ import annotations

import threading
import time
from multiprocessing.context import BaseContext
from multiprocessing.sharedctypes import SynchronizedString
from typing import cast

from app.backend.download import forkserver
from app.backend.download.budget import ConnectionBudget
from app.backend.download.types import SpaceError, StopSignal


class SharedFlag:
    """A stop flag every process of a run sees: set once, polled (threading.Event's is_set/set/wait).

    Not multiprocessing.Event, whose set() runs a Condition's notify (see ConnectionBudget). No lock: one
    byte, only ever set."""

    POLL_S = 0.02

    def __init__(self, ctx: BaseContext) -> None:
        self._value = ctx.RawValue("b", 0)

    def is_set(self) -> bool:
        return bool(self._value.value)

    def set(self) -> None:
        self._value.value = 1

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._value.value:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.POLL_S, left))
        return True


class RunGroup:
    """What the artifacts running at once share: the connection budget, the disk and a group stop.

    `stop` is set by the user's Pause/Cancel or by a full disk in any artifact (the disk is shared: the
    others pause too, keeping what they verified); a failure of any other kind stops only its own
    artifact. `user_stop` (the user's Pause/Cancel) lives in the parent only, mirrored into `stop` by
    `watch_user`.

    Locks: `_space`'s own lock guards the first disk-full message. `_remaining` and `_all_fetched` have
    none: each entry has one writer (its artifact, then the parent once that one's process has gone), and
    a lock a killed process held would be held for ever. `_cancel` is one byte with one writer
    (`watch_user`).
    """

    def __init__(self, connections: int, user_stop: threading.Event, jobs: int = 1, ids: list[str] | None = None,
                 ctx: BaseContext | None = None, to_fetch: list[int] | None = None) -> None:
        ctx = ctx or forkserver.context()
        self.budget = ConnectionBudget(connections, ctx, ranks=len(ids or []), weights=to_fetch)
        # Each fetch worker holds a libcurl handle and 0.5 MiB of buffers (ranged.py), so artifacts running
        # side by side do not each get `connections` of them: twice their even share, which leaves the
        # budget room to shift slots to the artifact whose extractor waits (docs/downloads.md, "Workers per artifact").
        self.workers_per_artifact = min(connections, max(2, -(-2 * connections // max(jobs, 1))))
        self.user_stop: threading.Event | None = user_stop
        self.stop = SharedFlag(ctx)
        self._space = cast(SynchronizedString, ctx.Array("c", 4096))  # the first disk-full message, for every process's pause reason
        self._cancel = ctx.RawValue("b", 0)
        self._ids = list(ids or [])
        self._remaining = ctx.RawArray("q", max(len(self._ids), 1))  # extracted bytes still to write, per artifact
        # 1 once an artifact has every part on disk: its connections are free, and the next artifact may start
        # beside its decoder's tail (runner.py, docs/downloads.md, "Overlap")
        self._all_fetched = ctx.RawArray("b", max(len(self._ids), 1))
        self._wake = ctx.Semaphore(0)  # a wake-up for the runner's launcher: a fetch ended, or a run did

    def __getstate__(self) -> dict[str, object]:
        """For a child process: the shared primitives only (the user's stop lives in the parent)."""
        return {**self.__dict__, "user_stop": None}

    def disk_full(self, exc: SpaceError) -> None:
        with self._space.get_lock():
            if not self._space.value:
                self._space.value = exc.message.encode()[: len(self._space) - 1]
        self.stop.set()

    @property
    def space_error(self) -> SpaceError | None:
        with self._space.get_lock():
            message = self._space.value
        return SpaceError(message.decode(errors="replace")) if message else None

    def watch_user(self) -> None:
        """Mirror the user's stop into the group stop (runs in a thread until the group stops)."""
        assert self.user_stop is not None  # the parent's group
        while not self.stop.is_set():
            if self.user_stop.wait(0.2):
                self._cancel.value = int(isinstance(self.user_stop, StopSignal) and self.user_stop.cancelled)
                self.stop.set()

    def rank(self, art_id: str) -> int:
        """An artifact's priority for connections: its place in the run order (largest first)."""
        return self._ids.index(art_id) if art_id in self._ids else max(len(self._ids) - 1, 0)

    def set_remaining(self, art_id: str, remaining: int) -> None:
        """Extracted bytes an artifact still has to write (0 once it has ended)."""
        if art_id not in self._ids:  # an artifact the group was not told of (tests build bare groups)
            return
        self._remaining[self._ids.index(art_id)] = remaining

    def fetched_all(self, art_id: str) -> None:
        """An artifact has every part on disk: the next one may start beside it (runner.py)."""
        if art_id in self._ids and not self._all_fetched[self._ids.index(art_id)]:
            self._all_fetched[self._ids.index(art_id)] = 1
            self.wake()

    def has_fetched_all(self, art_id: str) -> bool:
        return art_id in self._ids and bool(self._all_fetched[self._ids.index(art_id)])

    def wake(self) -> None:
        self._wake.release()

    def wait_wake(self, timeout: float) -> None:
        """Until fetched_all / wake, or `timeout` (the caller checks its condition again either way)."""
        self._wake.acquire(timeout=timeout)

    def remaining(self) -> tuple[int, int]:
        """(extracted bytes still to write by every running artifact, how many are running)."""
        running = [r for r in self._remaining[:] if r > 0]
        return sum(running), max(len(running), 1)

    @property
    def cancelled(self) -> bool:
        return bool(self._cancel.value) or (isinstance(self.user_stop, StopSignal) and self.user_stop.cancelled)
