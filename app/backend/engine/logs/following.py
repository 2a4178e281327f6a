"""Follow one engine run's stdout and stderr into the log store, feeding the boot tracker while it boots.

A `LogFollower` is owned by the engine controller (composition: it knows nothing of the controller's
state). Each run gets a token, so a late line of the previous run can never reach the next run's store
or boot picture. The controller is told, through two callbacks, when a line moved the boot picture and
when both streams ended (the engine probably exited: time to read Docker). Boot regexes only run while
`booting()` says so (docs/engine.md, "Logs": after ready a line cannot change the boot picture).
"""

from __future__ import annotations

import calendar
import threading
import time
from typing import Callable

from app.backend.engine.logs.bootlog import BootProgress, BootTracker
from app.backend.engine.logs.logstore import LogStore
from app.backend.engine.runtime.base import Instance, LogFollow, Runtime, Stream
from app.backend.contracts import LogLine

BootCallback = Callable[[str, BootProgress], None]  # (container id, progress after the line)


class LogFollower:
    """One follow at a time: `begin` replaces the previous run's follow; `end` closes it."""

    def __init__(self, logs: LogStore, *, booting: Callable[[], bool], on_boot_progress: BootCallback,
                 on_ended: Callable[[str], None]) -> None:
        self.logs = logs
        self._booting = booting
        self._on_boot_progress = on_boot_progress
        self._on_ended = on_ended
        self._mutex = threading.Lock()
        self._follow: LogFollow | None = None
        self._token = 0
        self._streams_open = 0
        self._tracker = BootTracker()

    @property
    def tracker(self) -> BootTracker:
        """The boot picture of the run being followed (a fresh one before the first run)."""
        with self._mutex:
            return self._tracker

    def begin(self, rt: Runtime, inst: Instance, *, from_start: bool, tracker: BootTracker | None = None,
              backlog: list[tuple[Stream, str]] | None = None) -> None:
        """Follow `inst`. `tracker`/`backlog`: the boot picture and lines an adopter already read from Docker."""
        self.end()
        with self._mutex:
            self._token += 1
            token = self._token
            self._tracker = tracker or BootTracker()
            self._streams_open = 2
        self.logs.begin_run(inst.name, started_epoch(inst.started_at))
        for stream, text in backlog or []:  # already persisted by whoever followed this run before
            self.logs.append(LogLine(text=text, stream=stream, container_id=inst.id), persist=False)

        def sink(stream: Stream, text: str | None) -> None:
            self._on_line(token, inst.id, stream, text)

        follow = rt.follow_logs(inst.id, sink, from_start=from_start, tail=0)
        with self._mutex:
            if token == self._token:
                self._follow = follow
                return
        follow.close()  # ended meanwhile

    def end(self) -> None:
        with self._mutex:
            follow, self._follow = self._follow, None
            self._token += 1
        if follow is not None:
            follow.close()
        self.logs.end_run()

    def drain(self, timeout: float = 3.0) -> None:
        """Give the streams a moment to deliver the last lines of an exited engine."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._mutex:
                if self._streams_open <= 0:
                    return
            time.sleep(0.02)

    def _on_line(self, token: int, cid: str, stream: Stream, text: str | None) -> None:
        with self._mutex:
            if token != self._token:
                return
            if text is None:
                self._streams_open -= 1
                ended = self._streams_open == 0
            tracker = self._tracker
        if text is None:
            if ended:
                self._on_ended(cid)
            return
        self.logs.append(LogLine(text=text, stream=stream, container_id=cid))
        if self._booting() and tracker.feed(text):
            self._on_boot_progress(cid, tracker.progress)


def started_epoch(started_at: str) -> float:
    """Docker/ProcessRuntime ISO start time -> epoch (names the run's log files; same run, same files)."""
    try:
        return float(calendar.timegm(time.strptime(started_at[:19], "%Y-%m-%dT%H:%M:%S")))
    except ValueError:
        return time.time()
