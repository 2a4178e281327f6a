"""One background job at a time, with a progress value readers poll: the self-test and the blind A/B
(docs/selftest.md). The RUNNING check and the launch happen under one lock, so a double click or two
tabs starting at once get one job and one refusal."""

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


class _Progress(Protocol):
    @property
    def state(self) -> JobState: ...


P = TypeVar("P", bound=_Progress)


class BackgroundJob(Generic[P]):
    def __init__(self, idle: P, thread_name: str) -> None:
        self._lock = threading.Lock()
        self._progress = idle
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._thread_name = thread_name

    def progress(self) -> P:
        with self._lock:
            return self._progress

    def running(self) -> bool:
        return self.progress().state is JobState.RUNNING

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout: float) -> P:
        """Join the job's thread for up to `timeout` seconds; the progress as it then stands."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.progress()

    def _set(self, p: P) -> None:
        with self._lock:
            self._progress = p

    def _launch(self, first: P, target: Callable[[], None]) -> bool:
        """Start `target` in the background with `first` as the progress; False (nothing started) when a
        job is already running."""
        with self._lock:
            if self._progress.state is JobState.RUNNING:
                return False
            self._cancel.clear()
            self._progress = first
            self._thread = threading.Thread(target=target, name=self._thread_name, daemon=True)
            self._thread.start()
        return True
