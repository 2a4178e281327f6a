"""The one poller of the tests: wait for a condition with a deadline, never a bare sleep as synchronisation."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition", interval: float = 0.02) -> Any:
    """Poll `pred` until truthy and return its value; it is asked at least once (a spent deadline too). Fails
    naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.2f}s waiting for {what}")
        time.sleep(interval)
