"""Gradio's event queue without its idle poll (issue 29; docs/ui-and-safety.md, "Idle cost").

Gradio 6.31's `Queue.start_processing` looks for work every `sleep_when_free` (1 ms) even when nothing is
queued, and `start_progress_updates` every 10 ms: ~1,100 wake-ups a second of the web server's event loop
with no browser open. Gradio has no setting for either. `install(blocks)` (before `launch`) is the one patch
point: the processing loop below is Gradio 6.31's own, except that when it finds nothing to do it waits for
a wake-up (an event pushed, a job finished) instead of polling, with a re-check every `IDLE_RECHECK_S` as a
safety net. Another Gradio version keeps Gradio's loop, polling every `FALLBACK_POLL_S` (the lock pins
6.31; tests/ui/test_idlequeue.py fails on an upgrade so that the copy is looked at again).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from enum import Enum
from typing import Any

import gradio as gr

COPIED_FROM = "6.31."  # Gradio version whose Queue.start_processing the loop below follows
IDLE_RECHECK_S = 0.5  # safety net: a wake-up this module does not know of is seen within this
FALLBACK_POLL_S = 0.01  # another Gradio version: its own loop, polled every 10 ms instead of 1 ms
PROGRESS_POLL_S = 1.0  # progress messages (gr.Progress, unused by the panel) at most once a second


class QueueMode(str, Enum):
    EVENT_DRIVEN = "event-driven"
    POLLING = "polling"  # Gradio's loop at FALLBACK_POLL_S
    UNTOUCHED = "untouched"  # no queue object where Gradio 6.31 keeps it


class _Waker:
    """Set when the queue may have work; created on the server's event loop (asyncio.Event binds to it)."""

    def __init__(self) -> None:
        self.event: asyncio.Event | None = None

    def wake(self) -> None:
        if self.event is not None:
            self.event.set()

    async def wait(self, timeout: float) -> None:
        assert self.event is not None  # noqa: S101 (set by the loop before its first wait)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout)
        self.event.clear()  # before the caller re-checks the queue: a later push sets it again


_NEEDED = ("push", "process_events", "get_events", "delete_lock", "active_jobs", "event_queue_per_concurrency_id",
           "event_analytics", "_asyncio_tasks", "_cancel_asyncio_tasks", "live_updates", "broadcast_estimations")


def install(blocks: gr.Blocks) -> QueueMode:
    """Make `blocks`' queue wait for work instead of polling for it. Call before `blocks.launch()`."""
    queue = getattr(blocks, "_queue", None)
    if queue is None or not hasattr(queue, "sleep_when_free"):  # private attributes: skip if Gradio renames them
        return QueueMode.UNTOUCHED
    queue.progress_update_sleep_when_free = PROGRESS_POLL_S
    if not gr.__version__.startswith(COPIED_FROM) or not all(hasattr(queue, a) for a in _NEEDED):
        queue.sleep_when_free = FALLBACK_POLL_S
        return QueueMode.POLLING
    waker = _Waker()
    push, process_events = queue.push, queue.process_events

    @functools.wraps(push)
    async def push_and_wake(*args: Any, **kwargs: Any) -> Any:
        try:
            return await push(*args, **kwargs)
        finally:
            waker.wake()

    @functools.wraps(process_events)
    async def process_and_wake(*args: Any, **kwargs: Any) -> Any:
        try:
            return await process_events(*args, **kwargs)
        finally:
            waker.wake()  # a job slot (and a concurrency slot) is free again

    # instance attributes: Queue.start() runs self.start_processing, routes call blocks._queue.push
    queue.push = push_and_wake
    queue.process_events = process_and_wake
    queue.start_processing = functools.partial(_start_processing, queue, waker)
    return QueueMode.EVENT_DRIVEN


async def _start_processing(queue: Any, waker: _Waker) -> None:
    """gradio/queueing.py (6.31) Queue.start_processing; `await asyncio.sleep(self.sleep_when_free)` → `waker.wait`."""
    from gradio.utils import run_coro_in_background, set_task_name

    waker.event = asyncio.Event()
    try:
        while not queue.stopped:
            if len(queue) == 0 or None not in queue.active_jobs:
                await waker.wait(IDLE_RECHECK_S)
                continue

            async with queue.delete_lock:  # Gradio: a mutex to avoid editing a list in use
                event_batch = queue.get_events()

            if event_batch:
                events, batch, concurrency_id = event_batch
                queue.active_jobs[queue.active_jobs.index(None)] = events
                event_queue = queue.event_queue_per_concurrency_id[concurrency_id]
                event_queue.current_concurrency += 1
                start_time = time.time()
                fn = events[0].fn
                event_queue.start_times_per_fn[fn].add(start_time)
                for event in events:
                    if (a := queue.event_analytics.get(event._id)) is not None:
                        a["status"] = "processing"
                task = run_coro_in_background(queue.process_events, events, batch, start_time, fn)
                set_task_name(task, events[0].session_hash, fn._id, events[0]._id, batch)
                queue._asyncio_tasks.add(task)
                task.add_done_callback(queue._asyncio_tasks.discard)
                if queue.live_updates:
                    queue.broadcast_estimations(concurrency_id)
            else:
                await waker.wait(IDLE_RECHECK_S)  # concurrency limits: a finishing job wakes the loop
    finally:
        queue.stopped = True
        queue._cancel_asyncio_tasks()
