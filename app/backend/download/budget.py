"""The connection budget: at most N ranged requests at once over every artifact of a run.

It crosses processes (procs.py runs each artifact in a child), so it is built on multiprocessing
primitives only: a lock, a semaphore of wake-ups and shared arrays (docs/downloads.md, "Three artifacts
at once" and "What crosses between processes").
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from multiprocessing.context import BaseContext

from app.backend.download import forkserver


class ConnectionBudget:
    """At most `size` ranged requests at once over every artifact, shared by bytes left to fetch.

    `weights` (compressed bytes each artifact still fetches) give each rank its share of the slots: a
    request of an artifact below its share goes first, since on a saturated link an artifact's share of
    the requests in flight is its share of the link (docs/downloads.md, "Sharing the link"). Among the
    requests that qualify, urgent ones go first: a segment of the part an extractor is waiting for (or an
    earlier one). Within each kind a lower `rank` goes first: the caller ranks artifacts largest first,
    since the largest one's chain bounds the run.

    Never a multiprocessing Condition: its notify waits for every sleeper to acknowledge, and a process
    that ended while one of its threads slept in wait() left notify hanging for ever. A wake-up here may
    be spurious (a waiter only looks again). What a process holds is counted per rank (= per artifact),
    so when one is killed the parent gives back its slots and drops its waiting requests (`forget`).

    `_lock` guards `_free`, `_waiting`, `_sleepers` and `_held`; `_quota` and `size` are fixed once built.
    """

    TAKE_OVER_S = 5.0

    def __init__(self, size: int, ctx: BaseContext | None = None, ranks: int = 1,
                 weights: list[int] | None = None) -> None:
        ctx = ctx or forkserver.context()
        self.size = size
        self._ranks = max(ranks, 1)
        # per rank: the slots it may hold while another artifact under its own share waits
        self._quota = ctx.RawArray("i", shares(size, weights) if weights and len(weights) == self._ranks
                                   else [size] * self._ranks)
        self._lock = ctx.Lock()
        self._wake = ctx.Semaphore(0)
        self._free = ctx.RawValue("i", size)
        # requests waiting, in the order they are served: urgent by rank, then read-ahead by rank
        self._waiting = ctx.RawArray("i", 2 * self._ranks)
        self._sleepers = ctx.RawArray("i", self._ranks)  # per rank: requests asleep on _wake
        self._held = ctx.RawArray("i", self._ranks)  # per rank: slots taken

    def acquire(self, urgent: Callable[[], bool], halt: threading.Event, rank: int = 0) -> bool:
        """Take a slot; False when `halt` was set while waiting.

        `urgent` is asked again while the request waits: a read-ahead request becomes urgent when its
        extractor reaches its part (docs/downloads.md, "What binds one artifact on many cores").
        """
        queue: int | None = None  # where this request is counted in self._waiting
        try:
            while True:
                with self._lock:
                    now = rank if urgent() else self._ranks + rank
                    if now != queue:
                        if queue is not None:
                            self._waiting[queue] -= 1
                        self._waiting[now] += 1
                        queue = now
                    if self._may_take(queue):
                        self._free.value -= 1
                        self._held[rank] += 1
                        return True
                    if halt.is_set():
                        return False
                    self._sleepers[rank] += 1
                self._wake.acquire(timeout=0.2)
                with self._lock:
                    self._sleepers[rank] -= 1
        finally:
            if queue is not None:
                with self._lock:
                    self._waiting[queue] -= 1

    def _may_take(self, queue: int) -> bool:
        """Under the lock: a free slot, and no request served before this one waits. A request of an
        artifact below its share goes before one of an artifact at or above it, whatever their kinds."""
        if self._free.value <= 0:
            return False

        def below(q: int) -> bool:
            r = q % self._ranks
            return bool(self._held[r] < self._quota[r])

        if below(queue):
            return not any(self._waiting[q] and below(q) for q in range(queue))
        return (not any(self._waiting[q] and below(q) for q in range(2 * self._ranks))
                and sum(self._waiting[:queue]) == 0)

    def forget(self, rank: int) -> None:
        """The process of artifact `rank` ended without letting go (kill -9, the OOM killer): give back
        its slots, drop its waiting and sleeping requests, and wake the others to look again."""
        # Every holder lets go of the lock within microseconds: one still held after TAKE_OVER_S was held
        # by the process that died, and is taken over (a multiprocessing Lock has no owner). Long enough
        # that a live holder descheduled on a loaded box is never overtaken.
        self._lock.acquire(timeout=self.TAKE_OVER_S)
        try:
            self._free.value += self._held[rank]
            self._held[rank] = self._sleepers[rank] = self._waiting[rank] = self._waiting[self._ranks + rank] = 0
        finally:
            self._lock.release()
        self.poke()

    @property
    def urgent_waiting(self) -> int:
        """Urgent requests waiting for a slot now."""
        with self._lock:
            return sum(self._waiting[:self._ranks])

    @property
    def waiting(self) -> int:
        """Requests of either kind waiting for a slot now."""
        with self._lock:
            return sum(self._waiting)

    def poke(self) -> None:
        """An extractor moved on to its next part: waiting requests ask `urgent` again."""
        with self._lock:
            sleepers = sum(self._sleepers)
        for _ in range(sleepers):
            self._wake.release()

    def release(self, rank: int = 0) -> None:
        with self._lock:
            self._free.value += 1
            self._held[rank] -= 1
        self.poke()


def shares(size: int, weights: list[int]) -> list[int]:
    """`size` slots split in proportion to `weights` (largest remainders), at least one each."""
    total = sum(weights)
    if total <= 0:
        return [size] * len(weights)
    exact = [size * w / total for w in weights]
    quota = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: exact[i] - quota[i], reverse=True)[:size - sum(quota)]:
        quota[i] += 1
    return [max(q, 1) for q in quota]
