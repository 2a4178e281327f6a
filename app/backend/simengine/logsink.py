"""Log output in vLLM's console format: `LEVEL MM-DD HH:MM:SS [file.py:line] msg`.

Engine-core lines carry the `(EngineCore_DP0 pid=N) ` prefix (TP1: the worker runs inside the engine
core), API-server lines `(APIServer pid=N) `; uvicorn's own lines go to stderr as `INFO:     msg`.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from typing import Callable, TextIO, Union

LogTarget = Union[Callable[[str], None], TextIO, None]


class LogSink:
    """Thread-safe line emitter: to a callback or a stream (or stdout/stderr), plus a bounded memory."""

    def __init__(self, target: LogTarget = None, engine_pid: int = 0, api_pid: int = 0, keep: int = 20000):
        self._target = target
        self._lock = threading.RLock()  # a callback may log again
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self.engine_pid = engine_pid
        self.api_pid = api_pid

    def raw(self, line: str, stderr: bool = False) -> None:
        with self._lock:
            self.lines.append(line)
            target = self._target
            if target is None:
                stream = sys.stderr if stderr else sys.stdout
                stream.write(line + "\n")
                stream.flush()
            elif hasattr(target, "write"):
                target.write(line + "\n")
                flush = getattr(target, "flush", None)
                if flush:
                    flush()
            else:
                target(line)

    def _fmt(self, level: str, src: str, msg: str) -> str:
        return f"{level} {time.strftime('%m-%d %H:%M:%S')} [{src}] {msg}"

    def engine(self, src: str, msg: str, level: str = "INFO") -> None:
        """A line from the engine-core process (model load, moe_w2 tier, [delta] ticks)."""
        self.raw(f"(EngineCore_DP0 pid={self.engine_pid}) " + self._fmt(level, src, msg))

    def api(self, src: str, msg: str, level: str = "INFO") -> None:
        """A line from the API server process (PID 1 in the container)."""
        self.raw(f"(APIServer pid={self.api_pid}) " + self._fmt(level, src, msg))

    def engine_plain(self, text: str) -> None:
        """Traceback text of a logger.exception() in the engine-core process: prefixed, stdout like the log."""
        for line in text.splitlines():
            self.raw(f"(EngineCore_DP0 pid={self.engine_pid}) {line}")

    def plain(self, text: str, stderr: bool = True) -> None:
        for line in text.splitlines():
            self.raw(line, stderr=stderr)

    def uvicorn(self, msg: str) -> None:
        self.raw(f"INFO:     {msg}", stderr=True)

    def tail(self, n: int = 200) -> list[str]:
        with self._lock:
            return list(self.lines)[-n:]
