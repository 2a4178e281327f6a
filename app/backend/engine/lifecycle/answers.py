"""Answers in flight, seen from another process on the same data dir (docs/engine.md "Keeps serving").

A stop or switch drains the answers that its own process streams (the panel's gateway and Chat tab,
`contracts.AnswerCounter`). A CLI `moet-panel engine switch` or a second panel is another process: it cannot ask
the panel's counters. So the panel publishes their sum in `<state dir>/answers-in-flight.json` whenever it
changes (`AnswersPublisher`, a 0.2 s look at in-memory counters, a write only on change), and every controller
counts what another live process published (`OtherProcessAnswers`): a switch from the CLI lets the panel's
gateway streams finish too. A publisher that died (its pid gone) counts 0.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from app.backend import oplog
from app.backend.contracts import AnswerCounter
from app.backend.files.atomic import pid_alive
from app.backend.files.jsonstore import JsonStore

FILE = "answers-in-flight.json"
POLL_S = 0.2


@dataclass(frozen=True)
class Published:
    pid: int
    count: int
    at: float


class OtherProcessAnswers:
    """contracts.AnswerCounter for the answers another live process on this data dir is streaming."""

    def __init__(self, state_dir: Path) -> None:
        self._store = JsonStore(Path(state_dir) / FILE, Published)

    def answers_in_flight(self) -> int:
        p = self._store.read()
        if p is None or p.pid == os.getpid() or not pid_alive(p.pid):
            return 0
        return max(0, p.count)


class AnswersPublisher:
    """In the panel: publishes the sum of its counters when it changes, until closed (then 0)."""

    def __init__(self, state_dir: Path, counters: Sequence[AnswerCounter]) -> None:
        self._store = JsonStore(Path(state_dir) / FILE, Published)
        self._counters = list(counters)
        self._stop = threading.Event()
        self._last: int | None = None
        self._thread = threading.Thread(target=self._loop, name="answers-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _count(self) -> int:
        total = 0
        for c in self._counters:
            try:
                total += c.answers_in_flight()
            except Exception as exc:  # a counter that fails counts 0, said once per kind of error
                oplog.caught("engine", exc, "counting answers in flight for other processes")
        return total

    def _publish(self, n: int) -> None:
        if n == self._last:
            return
        try:
            self._store.write(Published(os.getpid(), n, time.time()))
            self._last = n
        except OSError as exc:  # a full disk: other processes then drain without these answers
            if self._last is not None:
                oplog.caught("engine", exc, "publishing the answers in flight")
            self._last = None

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self._publish(self._count())

    def close(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(2)
        self._publish(0)
