"""The fair queue in front of the engine (docs/gateway.md "The fair queue"): turns by key, bounded, cancellable,
resized when the running profile serves more or fewer sequences."""

from __future__ import annotations

import asyncio
from typing import TypeVar

import pytest

from tests.aio import run_async
from app.backend.gateway.fairqueue import FairQueue, QueueFull, work

T = TypeVar("T")


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_a_freed_slot_goes_to_the_key_served_least_recently_not_to_the_oldest_request() -> None:
    async def main() -> list[str]:
        q = FairQueue(slots=1, max_waiting=10)
        order: list[str] = []
        await q.acquire("greedy")  # running
        tasks = [asyncio.ensure_future(q.acquire(k)) for k in ("greedy", "greedy", "greedy", "polite")]
        for t, k in zip(tasks, ("greedy", "greedy", "greedy", "polite"), strict=True):
            t.add_done_callback(lambda _t, k=k: order.append(k))
        await _settle()
        assert len(q) == 4
        for _ in range(4):
            q.release()
            await _settle()
        q.release()
        assert q.busy == 0 and len(q) == 0
        return order

    assert run_async(main) == ["polite", "greedy", "greedy", "greedy"]


def test_bounded_and_a_cancelled_waiter_leaves_without_taking_a_slot() -> None:
    async def main() -> None:
        q = FairQueue(slots=1, max_waiting=1)
        await q.acquire("a")
        waiter = asyncio.ensure_future(q.acquire("b"))
        await _settle()
        with pytest.raises(QueueFull):
            await q.acquire("c")
        waiter.cancel()
        await _settle()
        assert len(q) == 0 and q.busy == 1
        q.release()
        assert q.busy == 0

    run_async(main)


def test_resizing_hands_new_slots_to_waiters_and_shrinks_as_requests_end() -> None:
    async def main() -> None:
        q = FairQueue(slots=1, max_waiting=10)
        await q.acquire("a")
        waiters = [asyncio.ensure_future(q.acquire(k)) for k in ("b", "c", "d")]
        await _settle()
        q.resize(3)  # a profile with --max-num-seqs 3 now runs
        await _settle()
        assert q.busy == 3 and sum(w.done() for w in waiters) == 2 and len(q) == 1
        q.resize(1)
        q.release()  # over the new size: the slot is not handed on
        await _settle()
        assert q.busy == 2 and len(q) == 1
        q.release()
        q.release()  # back at the size: the last waiter gets its turn
        await _settle()
        assert all(w.done() for w in waiters) and q.busy == 1

    run_async(main)


def test_turns_are_weighed_by_work() -> None:
    async def main() -> list[str]:
        q = FairQueue(slots=1, max_waiting=20)
        order: list[str] = []
        big, small = work(256_000, 4000), work(20, 30)  # a 256K prompt and a long answer; "hi"
        await q.acquire("big", big)  # running
        waiters = [("big", big)] + [("small", small)] * 5
        tasks = [asyncio.ensure_future(q.acquire(k, c)) for k, c in waiters]
        for t, (k, _) in zip(tasks, waiters, strict=True):
            t.add_done_callback(lambda _t, k=k: order.append(k))
        await _settle()
        for _ in range(len(waiters) + 1):
            q.release()
            await _settle()
        assert q.busy == 0
        return order

    # five small requests' work is far below the big one's: all go before its second turn (before: turns by
    # request, so the big key's second request went second)
    assert run_async(main) == ["small"] * 5 + ["big"]


def test_the_engines_usage_replaces_the_estimate() -> None:
    async def main() -> list[str]:
        q = FairQueue(slots=1, max_waiting=10)
        order: list[str] = []
        await q.acquire("b", work(10, 100))  # b's answer of 100 tokens
        q.settle("b", work(10, 100), work(10, 100))
        q.release()
        await q.acquire("a", work(10, 4096))  # a is charged its cap while it runs...
        q.settle("a", work(10, 4096), work(10, 3))  # ...and the engine made 3 tokens
        waiters = [("b", work(10, 100)), ("a", work(10, 3))]
        tasks = [asyncio.ensure_future(q.acquire(k, c)) for k, c in waiters]
        for t, (k, _) in zip(tasks, waiters, strict=True):
            t.add_done_callback(lambda _t, k=k: order.append(k))
        await _settle()
        q.release()
        await _settle()
        q.release()
        await _settle()
        q.release()
        return order

    # a did 3 tokens' work, b 100: a goes first (charged its 4,096-token estimate, it would have gone second)
    assert run_async(main) == ["a", "b"]


def test_ahead_counts_the_keys_whose_turn_comes_first_in_the_order_slots_are_handed() -> None:
    """The Chat tab's "waiting for the GPU (n ahead)" (docs/chat.md "Taking turns") follows `_hand_over`'s order."""
    async def main() -> tuple[dict[str, int], list[str]]:
        q = FairQueue(slots=1, max_waiting=10)
        order: list[str] = []
        await q.acquire("greedy", work(10, 4000))  # running: much work done for it
        waiters = [("greedy", work(10, 4000)), ("chat", work(10, 30)), ("other", work(10, 30))]
        tasks = [asyncio.ensure_future(q.acquire(k, c)) for k, c in waiters]
        for t, (k, _) in zip(tasks, waiters, strict=True):
            t.add_done_callback(lambda _t, k=k: order.append(k))
        await _settle()
        ahead = q.ahead()
        for _ in range(len(waiters) + 1):
            q.release()
            await _settle()
        return ahead, order

    ahead, order = run_async(main)
    assert ahead == {"chat": 0, "other": 1, "greedy": 2}
    assert order == sorted(ahead, key=ahead.__getitem__)
