"""Caught errors of the engine's loops, logged ONCE (docs/engine.md, "The operator's log").

A poll that fails the same way every second (Docker away, a listener's bug hit by every log line) writes one
line to the operator's log, and another only when the error changes or comes back after `recovered()`.
"""

from __future__ import annotations

import logging
import threading

from app.backend import oplog


class ErrorsOnce:
    def __init__(self, component: str = "engine") -> None:
        self.component = component
        self._last: dict[str, str] = {}  # context -> the error last logged for it
        self._lock = threading.Lock()

    def caught(self, context: str, exc: BaseException, *, traceback: bool = False, level: int = logging.WARNING) -> bool:
        """Log `exc` for `context` unless it is the one logged last; True when it was logged."""
        text = f"{type(exc).__name__}: {exc}"
        with self._lock:
            if self._last.get(context) == text:
                return False
            self._last[context] = text
        oplog.caught(self.component, exc, context, traceback=traceback, level=level)
        return True

    def recovered(self, context: str) -> bool:
        """The context works again; True when it had failed (the caller may log the recovery once)."""
        with self._lock:
            return self._last.pop(context, None) is not None


ENGINE_ERRORS = ErrorsOnce()  # the shared helpers' (log store, event bus, GPU release wait): one per process
