"""Engine change events: what the controller publishes after every state-machine step (docs/engine.md,
"One writer, events out").

llama-swap's shape (../shared/reference/style.md): the writer publishes a change; listeners subscribe instead
of polling. Publishing never blocks the writer: each subscriber has its own bounded queue, and a subscriber
that falls behind loses its OLDEST events (the newest snapshot is what matters; `dropped` counts the loss).
A callback subscriber gets a daemon thread of its own that drains its queue, so a slow callback (an Apprise
send, a UI push) delays nobody else.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from app.backend.contracts import EngineSnapshot

DEFAULT_QUEUE = 256


@dataclass(frozen=True)
class EngineChanged:
    """One applied state-machine event: its name, the snapshot before and after."""

    seq: int
    event: str  # the statemachine event's class name, e.g. "BecameReady", "Failed", "Supervised"
    before: EngineSnapshot
    after: EngineSnapshot
    ts: float = field(default_factory=time.time)


class Subscription:
    """A subscriber's queue. `get()` waits for the next event; `close()` unsubscribes."""

    def __init__(self, bus: EventBus, maxsize: int) -> None:
        self._bus = bus
        self._q: queue.Queue[EngineChanged | None] = queue.Queue(maxsize=maxsize)  # None: close()'s wake-up
        self.dropped = 0
        self.closed = False

    def _offer(self, ev: EngineChanged) -> None:
        while not self.closed:
            try:
                self._q.put_nowait(ev)
                return
            except queue.Full:
                try:  # drop the oldest: never block the writer
                    self._q.get_nowait()
                    self.dropped += 1
                except queue.Empty:
                    pass

    def get(self, timeout: float | None = None) -> EngineChanged | None:
        """The next event, or None when the timeout passed (or the subscription was closed)."""
        if self.closed:
            return None
        try:
            return self._q.get(timeout=timeout)  # None: close() woke the waiter
        except queue.Empty:
            return None

    def drain(self) -> list[EngineChanged]:
        out: list[EngineChanged] = []
        while True:
            try:
                ev = self._q.get_nowait()
            except queue.Empty:
                return out
            if ev is not None:
                out.append(ev)

    def close(self) -> None:
        self.closed = True
        self._bus._remove(self)
        while True:  # wake a waiting get() at once (a closed subscription's events no longer matter)
            try:
                self._q.put_nowait(None)
                return
            except queue.Full:
                try:
                    self._q.get_nowait()
                except queue.Empty:
                    pass


class EventBus:
    """Fan-out of EngineChanged to subscribers (queues or callbacks)."""

    def __init__(self) -> None:
        self._subs: list[Subscription] = []
        self._lock = threading.Lock()
        self._seq = itertools.count(1)

    def subscribe(self, maxsize: int = DEFAULT_QUEUE) -> Subscription:
        sub = Subscription(self, maxsize)
        with self._lock:
            self._subs.append(sub)
        return sub

    def subscribe_callback(self, cb: Callable[[EngineChanged], None], name: str = "engine-listener",
                           maxsize: int = DEFAULT_QUEUE) -> Callable[[], None]:
        """Call `cb(event)` on a thread of its own for every event; returns the unsubscribe function."""
        sub = self.subscribe(maxsize)

        def pump() -> None:
            while not sub.closed:
                ev = sub.get(timeout=0.5)
                if ev is None:
                    continue
                try:
                    cb(ev)
                except Exception:  # a listener's bug must not end its own stream of events
                    pass

        threading.Thread(target=pump, name=name, daemon=True).start()
        return sub.close

    def publish(self, event: str, before: EngineSnapshot, after: EngineSnapshot) -> EngineChanged:
        ev = EngineChanged(next(self._seq), event, before, after)
        with self._lock:
            subs = list(self._subs)
        for sub in subs:
            sub._offer(ev)
        return ev

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subs)
