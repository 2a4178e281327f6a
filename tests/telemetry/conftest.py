"""Telemetry test helpers: the engine-log fixtures (copied from shared/fixtures/engine-logs) and fakes."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import pytest

from app.backend.contracts import EngineSnapshot, EngineState, LogLine

FIXTURES = Path(__file__).parent / "fixtures" / "engine-logs"
ALL_LOGS = sorted(p.name for p in FIXTURES.glob("*.log"))


def log_text(name: str) -> str:
    return (FIXTURES / name).read_text()


class FakeEngine:
    """The slice of EngineController the hub uses: snapshot, log listeners, recent logs, pids."""

    def __init__(self, snapshot: EngineSnapshot | None = None) -> None:
        from app.backend.engine.decider.events import EventBus

        self._snap = snapshot or EngineSnapshot()
        self.events = EventBus()  # `set` publishes like the controller's reconciler
        self._listeners: list[Callable[[LogLine], None]] = []
        self._recent: list[LogLine] = []
        self._lock = threading.Lock()
        self.pids: set[int] = set()

    def snapshot(self) -> EngineSnapshot:
        return self._snap

    def set(self, **kw) -> None:
        import dataclasses

        before, self._snap = self._snap, dataclasses.replace(self._snap, **kw)
        self.events.publish("FakeChange", before, self._snap)

    def watch(self, on_change=None):
        return self.events.watch(self._snap, on_change)

    def add_log_listener(self, cb):
        with self._lock:
            self._listeners.append(cb)
        return lambda: self._listeners.remove(cb)

    def recent_logs(self, n: int) -> list[LogLine]:
        return self._recent[-n:]

    def container_pids(self) -> set[int]:
        return set(self.pids)

    runtime = None  # a test hands in one with `tail_logs` (the log tail of a run the hub did not see boot)

    def log_tail(self, container_id: str, n: int) -> list[tuple[str, str]]:
        return self.runtime.tail_logs(container_id, n) if self.runtime is not None else []

    def emit(self, text: str) -> None:
        ln = LogLine(text=text)
        self._recent.append(ln)
        for cb in list(self._listeners):
            cb(ln)

    @property
    def listener_count(self) -> int:
        return len(self._listeners)


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine(EngineSnapshot(state=EngineState.READY, profile_id="quality"))
