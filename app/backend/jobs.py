"""One background job at a time: the self-test, the blind A/B (docs/selftest.md) and the downloads.

`SingleFlight` is the one runner: the busy check and the launch happen under one lock, so a double
click or two tabs starting at once get one job and one refusal; each launch gets a fresh StopSignal,
so a stop asked of an earlier job never stops the next. `BackgroundJob` adds a progress value readers
poll (the self-test and the A/B); the downloads keep their own picture (the board, the journal).
"""

from __future__ import annotations

import threading
from enum import Enum
from typing import Callable, Generic, Protocol, TypeVar


class JobState(str, Enum):
    IDLE = "idle"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"


class StopSignal(threading.Event):
    """A job's stop: set by Pause or Cancel; `cancelled` tells the two apart (a paused download resumes)."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = False

    def request(self, *, cancel: bool) -> None:
        self.cancelled = self.cancelled or cancel
        self.set()


class SingleFlight:
    """One background thread at a time. Busy while that thread lives (`_busy` may say otherwise).

    `lock` is held while launching: an owner may guard its own fields with it, so that what `setup` sets
    and what they guard are seen together."""

    def __init__(self, thread_name: str) -> None:
        self.lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = StopSignal()
        self._thread_name = thread_name

    @property
    def started(self) -> bool:
        """Whether any job was launched yet."""
        return self._thread is not None

    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def _busy(self) -> bool:
        """Under `lock`: whether a launch now is refused."""
        return self.alive()

    def launch(self, target: Callable[[StopSignal], None],
               setup: Callable[[StopSignal], None] | None = None) -> bool:
        """Run `target(stop)` in a new thread; False (nothing started, `setup` not called) when busy.
        `setup(stop)` runs first, under `lock`."""
        with self.lock:
            if self._busy():
                return False
            stop = StopSignal()
            if setup is not None:
                setup(stop)
            self._stop = stop
            self._thread = threading.Thread(target=target, args=(stop,), name=self._thread_name, daemon=True)
            self._thread.start()
        return True

    def request_stop(self, *, cancel: bool) -> None:
        """Ask the current job to stop (a no-op for a finished one: the next launch has a fresh signal)."""
        self._stop.request(cancel=cancel)

    def join(self, timeout: float) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout)

    def stop_and_join(self, *, cancel: bool, timeout: float) -> bool:
        """Ask the running job to stop and wait up to `timeout` s for its end; False when none was running."""
        if not self.alive():
            return False
        self.request_stop(cancel=cancel)
        self.join(timeout)
        return True


class _Progress(Protocol):
    @property
    def state(self) -> JobState: ...


P = TypeVar("P", bound=_Progress)


class BackgroundJob(SingleFlight, Generic[P]):
    """A SingleFlight with a progress value; busy while the progress says RUNNING (the thread may still
    be returning after it wrote DONE: a new job may start then)."""

    def __init__(self, idle: P, thread_name: str) -> None:
        super().__init__(thread_name)
        self._progress = idle

    def progress(self) -> P:
        with self.lock:
            return self._progress

    def running(self) -> bool:
        return self.progress().state is JobState.RUNNING

    def _busy(self) -> bool:
        return self._progress.state is JobState.RUNNING

    def cancel(self) -> None:
        self.request_stop(cancel=True)

    def wait(self, timeout: float) -> P:
        """Join the job's thread for up to `timeout` seconds; the progress as it then stands."""
        self.join(timeout)
        return self.progress()

    def _set(self, p: P) -> None:
        with self.lock:
            self._progress = p

    def _launch(self, first: P, target: Callable[[], None]) -> bool:
        """Start `target` in the background with `first` as the progress; False (nothing started) when a
        job is already running. `target` reads its stop as `self._stop`."""

        def setup(_: StopSignal) -> None:
            self._progress = first  # under the lock already

        return self.launch(lambda _: target(), setup)
