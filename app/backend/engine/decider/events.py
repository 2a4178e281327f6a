"""Engine change events: what the controller publishes after every state-machine step (docs/engine.md,
"One writer, events out").

llama-swap's shape (../shared/reference/style.md): the writer publishes a change; listeners subscribe instead
of polling. Publishing never blocks the writer: each subscriber has its own bounded queue, and a subscriber
that falls behind loses its OLDEST events (the newest snapshot is what matters; `dropped` counts the loss).
A callback subscriber gets a daemon thread of its own that drains its queue, so a slow callback (an Apprise
send, a UI push) delays nobody else. A `SnapshotWatch` keeps only the newest snapshot and its event number, set
by the publisher in line: for a reader that asks "what is it now, and did it change since I looked" (the
telemetry hub, the chat, the page's redraw; docs/engine.md, "Who listens").
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from app.backend.engine.errlog import ENGINE_ERRORS
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


class SnapshotWatch:
    """The newest snapshot and the `seq` of the event that made it (0: none since the watch began).

    Set by the publisher in line (one assignment and a notify: never behind the writer, no thread, no queue),
    so a reader that keeps the last `seq` it acted on knows at once whether anything changed, and `wait()`
    wakes on the next change. `on_change` runs in the writer's thread right after the assignment: it may only
    flag (an `Event.set()`), never block or call back into the engine."""

    def __init__(self, bus: EventBus, seq: int, snapshot: EngineSnapshot,
                 on_change: Callable[[], None] | None = None) -> None:
        self._bus = bus
        self._cond = threading.Condition()
        self._state = (seq, snapshot)  # one reference: a reader never sees a seq with another event's snapshot
        self._on_change = on_change
        self.closed = False

    @property
    def seq(self) -> int:
        return self._state[0]

    @property
    def snapshot(self) -> EngineSnapshot:
        return self._state[1]

    def current(self) -> tuple[int, EngineSnapshot]:
        return self._state

    def wait(self, after: int, timeout: float) -> tuple[int, EngineSnapshot]:
        """(seq, snapshot) as soon as seq differs from `after`, else when the timeout passed or the watch closed."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._state[0] == after and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._state

    def _set(self, ev: EngineChanged) -> None:
        with self._cond:
            self._state = (ev.seq, ev.after)
            self._cond.notify_all()
        if self._on_change is not None:
            try:
                self._on_change()
            except Exception as exc:  # a listener's bug must not reach the writer
                ENGINE_ERRORS.caught("a snapshot watch's change callback", exc, traceback=True)

    def close(self) -> None:
        self.closed = True
        self._bus._remove_watch(self)
        with self._cond:
            self._cond.notify_all()


class EventBus:
    """Fan-out of EngineChanged to subscribers (queues, callbacks, watches)."""

    def __init__(self) -> None:
        self._subs: list[Subscription] = []
        self._watches: list[SnapshotWatch] = []
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self.last_seq = 0  # the seq of the last event published (0: none yet)

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
                except Exception as exc:  # a listener's bug must not end its own stream of events
                    ENGINE_ERRORS.caught(f"the engine listener {name}", exc, traceback=True)

        threading.Thread(target=pump, name=name, daemon=True).start()
        return sub.close

    def watch(self, current: EngineSnapshot, on_change: Callable[[], None] | None = None) -> SnapshotWatch:
        """A SnapshotWatch starting from `current` (the publisher's snapshot now: the caller makes both under the
        lock it publishes under, `EngineController.watch`, so no change falls between them)."""
        w = SnapshotWatch(self, self.last_seq, current, on_change)
        with self._lock:
            self._watches.append(w)
        return w

    def publish(self, event: str, before: EngineSnapshot, after: EngineSnapshot) -> EngineChanged:
        ev = EngineChanged(next(self._seq), event, before, after)
        self.last_seq = ev.seq
        with self._lock:
            subs = list(self._subs)
            watches = list(self._watches)
        for w in watches:  # first: a reader woken by the controller's own waiters already sees it in its watch
            w._set(ev)
        for sub in subs:
            sub._offer(ev)
        return ev

    def _remove_watch(self, w: SnapshotWatch) -> None:
        with self._lock:
            if w in self._watches:
                self._watches.remove(w)

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)

    @property
    def subscribers(self) -> int:
        """Queues, callbacks and watches listening now (a leak shows here)."""
        with self._lock:
            return len(self._subs) + len(self._watches)
