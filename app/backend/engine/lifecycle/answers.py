"""Answers in flight, seen from another process on the same data dir (docs/engine.md "Keeps serving").

A stop or switch drains the answers that its own process streams (the panel's gateway and Chat tab,
`contracts.AnswerCounter`). A CLI `moet-panel engine switch`, a second panel or a standalone `moet-panel gateway`
is another process: it cannot ask the others' counters. So each process that streams answers publishes its count
in a file of its own, `<state dir>/answers-in-flight-<pid>.json`, whenever it changes (`AnswersPublisher`, a 0.2 s
look at in-memory counters, a write only on change), with the count per GPU on a box of several; every controller
counts what the other live processes published for its GPU (`OtherProcessAnswers`): a switch from the CLI lets the
streams of the panel's gateway and of a standalone gateway finish too, and a rolling switch's drain of GPU 0 waits
for GPU 0's answers only. A file per publisher: two gateways never overwrite each other's count. A publisher that
died (its pid gone) counts 0; its file is removed when it closes.

On a box of several GPUs a publisher also says which GPUs its gateway sends to now (`serving`): a rolling switch
takes a GPU out only once every other process's gateway sees another one serving (`OtherPublishers.serving`) — their view
of the engine the roll just booted lags by their own readiness probe, and meanwhile they would refuse everything.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.backend import oplog
from app.backend.contracts import AnswerCounter
from app.backend.files.atomic import pid_alive
from app.backend.files.jsonstore import JsonStore

PREFIX = "answers-in-flight"
POLL_S = 0.2
# answers per GPU, when the publisher streams on a box of several (GPU number -> answers on that GPU's engine)
ByGpu = Callable[[], dict[int, int]]
_Count = tuple[int, dict[str, int], list[int] | None]  # answers, per GPU, the GPUs served
# the GPUs the publisher's gateway sends new requests to now (a box of several)
Serving = Callable[[], list[int]]


def file_of(pid: int) -> str:
    return f"{PREFIX}-{pid}.json"


@dataclass(frozen=True)
class Published:
    pid: int
    count: int
    at: float
    by_gpu: dict[str, int] = field(default_factory=dict)  # "0" -> answers on GPU 0's engine; {}: not per GPU
    serving: list[int] | None = None  # the GPUs its gateway sends to now; None: not said (one GPU, no gateway)


class OtherPublishers:
    """The live other processes' published files of a state dir, read as they are now."""

    def __init__(self, state_dir: Path) -> None:
        self._dir = Path(state_dir)
        self._stores: dict[Path, JsonStore[Published]] = {}  # one per file (each says a broken file once)

    def read(self) -> list[Published]:
        out = []
        for path in self._dir.glob(f"{PREFIX}-*.json"):
            store = self._stores.get(path)
            if store is None:
                store = self._stores[path] = JsonStore(path, Published)
            p = store.read()
            if p is not None and p.pid != os.getpid() and pid_alive(p.pid):
                out.append(p)
        return out

    def serving(self) -> list[list[int]]:
        """The GPUs each other live process's gateway sends to now, for those that say (a box of several)."""
        return [p.serving for p in self.read() if p.serving is not None]


class OtherProcessAnswers:
    """contracts.AnswerCounter for the answers the other live processes on this data dir are streaming, on GPU
    `gpu`'s engine (None: the one engine of a one-GPU box, or a publisher that does not count per GPU)."""

    def __init__(self, state_dir: Path, gpu: int | None = None) -> None:
        self._files = OtherPublishers(state_dir)
        self._gpu = gpu

    def answers_in_flight(self) -> int:
        total = 0
        for p in self._files.read():
            if self._gpu is not None and p.by_gpu:
                total += max(0, p.by_gpu.get(str(self._gpu), 0))
            else:
                total += max(0, p.count)
        return total


class AnswersPublisher:
    """In a process that streams answers (the panel, a standalone gateway): publishes the sum of its counters, and
    per GPU with `by_gpu`, when they change, until closed (then its file goes)."""

    def __init__(self, state_dir: Path, counters: Sequence[AnswerCounter], by_gpu: ByGpu | None = None,
                 serving: Serving | None = None) -> None:
        self._store = JsonStore(Path(state_dir) / file_of(os.getpid()), Published)
        self._counters = list(counters)
        self._by_gpu = by_gpu
        self._serving = serving
        self._stop = threading.Event()
        self._poked = threading.Event()
        self._last: _Count | None = None
        self._thread = threading.Thread(target=self._loop, name="answers-publisher", daemon=True)

    @property
    def path(self) -> Path:
        return self._store.path

    def start(self) -> None:
        self._thread.start()

    def _count(self) -> _Count:
        total = 0
        for c in self._counters:
            try:
                total += c.answers_in_flight()
            except Exception as exc:  # a counter that fails counts 0, said once per kind of error
                oplog.caught("engine", exc, "counting answers in flight for other processes")
        gpus: dict[str, int] = {}
        if self._by_gpu is not None:
            try:
                gpus = {str(g): max(0, n) for g, n in self._by_gpu().items()}
            except Exception as exc:  # per GPU unknown: the total stands for every GPU (a drain waits longer)
                oplog.caught("engine", exc, "counting answers in flight per GPU for other processes")
        serving: list[int] | None = None
        if self._serving is not None:
            try:
                serving = sorted(self._serving())
            except Exception as exc:  # not said: a rolling switch then does not wait for this gateway
                oplog.caught("engine", exc, "reading the GPUs the gateway serves on, for other processes")
        return total, gpus, serving

    def _publish(self, now: _Count) -> None:
        if now == self._last:
            return
        try:
            self._store.write(Published(os.getpid(), now[0], time.time(), now[1], now[2]))
            self._last = now
        except OSError as exc:  # a full disk: other processes then drain without these answers
            if self._last is not None:
                oplog.caught("engine", exc, "publishing the answers in flight")
            self._last = None

    def poke(self) -> None:
        """A count changed (the gateway's report hook): publish now, not at the next look (a drain that starts
        between the two would not wait for an answer that just began)."""
        self._poked.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._poked.wait(POLL_S)
            self._poked.clear()
            if not self._stop.is_set():
                self._publish(self._count())

    def close(self) -> None:
        self._stop.set()
        self._poked.set()
        if self._thread.ident is not None:  # started
            self._thread.join(2)
        self._publish((0, {}, None))
        try:
            self._store.path.unlink(missing_ok=True)
        except OSError as exc:  # left behind: it says 0, and its pid is gone soon
            oplog.caught("engine", exc, "removing the answers-in-flight file")
