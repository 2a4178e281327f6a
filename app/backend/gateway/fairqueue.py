"""Slots to the engine, handed out in turn by key (docs/gateway.md "The fair queue").

The engine serves a few sequences at once (the card's recipe: `--max-num-seqs 1`) and queues the rest in
arrival order, so one key that sends many requests would hold everyone else behind all of them. The gateway
therefore sends at most `slots` requests to the engine; the others wait here, and a freed slot goes to the
waiting key that has had the least work done for it, not to the oldest request: two keys take turns, whatever each
sends, and a turn is weighed by its work (issue 50), so a 256K-token prompt or a 4,000-token answer costs its key
more than "hi" does.

Work is counted in generated-token equivalents (`work()`): `max_tokens` plus the prompt's tokens at
`PROMPT_WEIGHT` each (a prompt token is prefilled ~100 times faster than a token is decoded). Each key has a
virtual finish time, start-time fair queueing's: a turn starts at max(the queue's virtual time, the key's finish)
and moves the key's finish on by the turn's estimated work; when the request ends, its real work (the engine's
usage) replaces the estimate. A key that was idle starts at the queue's virtual time, so idleness banks no credit.
The queue is bounded (`QueueFull` beyond `max_waiting`); a waiter that is cancelled (its client hung up) leaves it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

PROMPT_WEIGHT = 0.01  # a prompt token's work in generated tokens: the card decodes 48.9 tok/s, prefills thousands


def work(prompt_tokens: float, completion_tokens: float) -> float:
    """A request's work in generated-token equivalents (docs/gateway.md "The fair queue")."""
    return max(1.0, completion_tokens + PROMPT_WEIGHT * prompt_tokens)


class QueueFull(Exception):
    """More requests wait than the queue holds; the caller answers 429."""


class FairQueue:
    def __init__(self, slots: int, max_waiting: int):
        self.slots = max(1, slots)
        self.max_waiting = max(0, max_waiting)
        self.busy = 0
        self._waiting: dict[str, deque[tuple[asyncio.Future[None], float]]] = {}  # first come among equals
        self._n_waiting = 0
        self._finish: dict[str, float] = {}  # key -> its virtual finish: the work done for it, in the queue's time
        self.vtime = 0.0  # the start of the last turn handed out

    def _turn_order(self, key: str) -> tuple[float, float]:
        """Who goes first: the earliest virtual start; among equal starts, the key with the least work done for it
        (a key that was idle — the Chat tab's first message — before keys whose last turn ended there), then the
        one that has waited longest (dict order)."""
        return self._start_of(key), self._finish.get(key, 0.0)

    def _start_of(self, key: str) -> float:
        return max(self.vtime, self._finish.get(key, 0.0))

    def _charge(self, key: str, cost: float) -> None:
        start = self._start_of(key)
        self._finish[key] = start + cost
        self.vtime = start

    def settle(self, key: str, estimated: float, actual: float) -> None:
        """A request of `key` ended: its real work replaces the estimate it was charged at its turn."""
        if key in self._finish:
            self._finish[key] = max(0.0, self._finish[key] + actual - estimated)
        if not self._waiting and self.busy <= 1:  # called before its own release: 1 is this request's slot
            self._forget_idle()

    def _forget_idle(self) -> None:
        """Keys whose finish is behind the queue's time start there anyway: drop them (bounded memory)."""
        for k in [k for k, f in self._finish.items() if f <= self.vtime]:
            del self._finish[k]

    def waiting_keys(self) -> set[str]:
        return set(self._waiting)

    def __len__(self) -> int:
        """Requests waiting for a slot (the `moet_panel_gateway_queue_length` gauge)."""
        return self._n_waiting

    async def acquire(self, key: str, cost: float = 1.0) -> float:
        """Wait for a slot for `key`, a request of `cost` work (`work()`); returns the seconds waited. Raises
        QueueFull, or CancelledError (the slot, if it had just been handed over, goes to the next waiter)."""
        if self.busy < self.slots and not self._n_waiting:
            self.busy += 1
            self._charge(key, cost)
            return 0.0
        if self._n_waiting >= self.max_waiting:
            raise QueueFull
        t0 = time.monotonic()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append((fut, cost))
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
        """For each waiting key, the requests that get a slot before its oldest waiter: the waiting keys whose turn
        starts earlier (less work done for them; ties as `_hand_over` breaks them: `_turn_order`) — one turn
        each comes first (the Chat tab's "waiting for the GPU (n ahead)")."""
        order = sorted(self._waiting, key=self._turn_order)
        return {k: i for i, k in enumerate(order)}

    def _forget(self, key: str, fut: asyncio.Future[None]) -> None:
        dq = self._waiting.get(key)
        item = next((it for it in dq if it[0] is fut), None) if dq is not None else None
        if dq is not None and item is not None:
            dq.remove(item)
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
        """A request left the engine: its slot goes to the waiting key with the least work done for it."""
        if self.busy > self.slots or not self._hand_over():  # shrunk (another profile), or nobody waits
            self.busy = max(0, self.busy - 1)

    def _hand_over(self) -> bool:
        """Give a slot to the waiting key with the earliest virtual start; False when nobody waits."""
        while self._waiting:
            key = min(self._waiting, key=self._turn_order)
            dq = self._waiting[key]
            fut, cost = dq.popleft()
            self._n_waiting -= 1
            if not dq:
                del self._waiting[key]
            if not fut.done():
                self._charge(key, cost)
                fut.set_result(None)  # the slot passes on: `busy` stays
                return True
        return False
