"""Slots to the engine, handed out in turn by key (docs/gateway.md "The fair queue").

The engine serves a few sequences at once (the card's recipe: `--max-num-seqs 1`) and queues the rest in
arrival order, so one key that sends many requests would hold everyone else behind all of them. The gateway
therefore sends at most `slots` requests to the engine; the others wait here, and a freed slot goes to the
waiting key that was served least recently, not to the oldest request: two keys take turns, whatever each sends.
The queue is bounded (`QueueFull` beyond `max_waiting`); a waiter that is cancelled (its client hung up) leaves it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque


class QueueFull(Exception):
    """More requests wait than the queue holds; the caller answers 429."""


class FairQueue:
    def __init__(self, slots: int, max_waiting: int):
        self.slots = max(1, slots)
        self.max_waiting = max(0, max_waiting)
        self.busy = 0
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}  # insertion order: first come among equals
        self._n_waiting = 0
        self._last: dict[str, int] = {}  # key -> the turn it last got (never: -1)
        self._turns = itertools.count()

    def __len__(self) -> int:
        """Requests waiting for a slot (the `moet_panel_gateway_queue_length` gauge)."""
        return self._n_waiting

    async def acquire(self, key: str) -> float:
        """Wait for a slot for `key`; returns the seconds waited. Raises QueueFull, or CancelledError (the
        slot, if it had just been handed over, goes to the next waiter)."""
        if self.busy < self.slots and not self._n_waiting:
            self.busy += 1
            self._last[key] = next(self._turns)
            return 0.0
        if self._n_waiting >= self.max_waiting:
            raise QueueFull
        t0 = time.monotonic()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(fut)
        self._n_waiting += 1
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # handed a slot in the same tick it was cancelled
                self.release()
            else:
                self._forget(key, fut)
            raise
        return time.monotonic() - t0

    def ahead(self) -> dict[str, int]:
        """For each waiting key, the requests that get a slot before its oldest waiter: the waiting keys served
        less recently than it (one turn each comes first; the Chat tab's "waiting for the GPU (n ahead)")."""
        order = sorted(self._waiting, key=lambda k: self._last.get(k, -1))
        return {k: i for i, k in enumerate(order)}

    def _forget(self, key: str, fut: asyncio.Future[None]) -> None:
        dq = self._waiting.get(key)
        if dq is not None and fut in dq:
            dq.remove(fut)
            self._n_waiting -= 1
            if not dq:
                del self._waiting[key]

    def resize(self, slots: int) -> None:
        """The engine now runs `slots` sequences (another profile): more slots go to waiters at once; fewer
        take effect as running requests end."""
        self.slots = max(1, slots)
        while self.busy < self.slots and self._hand_over():
            self.busy += 1

    def release(self) -> None:
        """A request left the engine: its slot goes to the waiting key served least recently."""
        if self.busy > self.slots or not self._hand_over():  # shrunk (another profile), or nobody waits
            self.busy = max(0, self.busy - 1)

    def _hand_over(self) -> bool:
        """Give a slot to the waiting key served least recently; False when nobody waits."""
        while self._waiting:
            key = min(self._waiting, key=lambda k: self._last.get(k, -1))
            dq = self._waiting[key]
            fut = dq.popleft()
            self._n_waiting -= 1
            if not dq:
                del self._waiting[key]
            if not fut.done():
                self._last[key] = next(self._turns)
                fut.set_result(None)  # the slot passes on: `busy` stays
                return True
        return False
