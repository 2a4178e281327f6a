"""Pacing for the SIMULATED hub's capped bodies: a per-connection cap and one link shared by all.

A real link with a queue in front of it runs at its rate as long as there is backlog, so a sender that
wakes a little late (Python's sleeps, the GIL) must be able to catch up; without that credit the hub
delivered ~8% under its own caps on the 16-core host (docs/downloads.md, "The hub's caps").
The credit is bounded (`burst_s` of the rate), so the average never exceeds the cap by more than one burst.
"""

from __future__ import annotations

import threading
import time

BURST_S = 0.005  # how far behind the clock a late sender may catch up: 5 ms of the rate
STEP_S = 0.005  # one paced send is ~5 ms of the connection's cap ...
STEP_MIN, STEP_MAX = 64 << 10, 1 << 20  # ... within these bounds (small caps in tests: 64 KiB steps)


class Pacer:
    """A virtual FIFO at `bps`: each send books its slot, and waits for the slot's start."""

    def __init__(self, bps: float, burst_s: float = BURST_S) -> None:
        self.bps, self._credit_s = bps, burst_s
        self._lock = threading.Lock()
        self._t = time.monotonic()

    def take(self, n: int) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(self._t, now - self._credit_s)
            self._t = start + n / self.bps
        if start > now:
            time.sleep(start - now)


def take_all(pacers: tuple[Pacer | None, ...], n: int) -> None:
    """Book n bytes on each pacer there is (the connection's, then the link's)."""
    for pacer in pacers:
        if pacer is not None:
            pacer.take(n)


def step_for(cap_bps: float | None) -> int:
    """The size of one paced send for a connection capped at `cap_bps` (the link alone: the largest)."""
    if not cap_bps:
        return STEP_MAX
    return int(min(STEP_MAX, max(STEP_MIN, cap_bps * STEP_S)))
