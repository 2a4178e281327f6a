"""systemd's watchdog (docs/engine.md, "Run as a service"): `WATCHDOG=1` only while the panel works.

The unit sets `WatchdogSec=`; systemd passes it as $WATCHDOG_USEC and restarts the panel when no `WATCHDOG=1`
arrives within it. A thread pinging blindly would keep a wedged panel "active" forever, so each ping is
earned: with an engine controller, its reconciler's heartbeat (`heartbeat()`: the monotonic time of its last
loop turn) must be younger than `stale_s`; without one, the panel's own liveness (the page server runs).
When the check fails the panel STOPS pinging and says why, once, in the operator's log — systemd then
restarts it (`Restart=on-failure`), and the engine keeps serving meanwhile (`KillMode=process`).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Protocol, runtime_checkable

from app.backend import oplog

PING = "WATCHDOG=1"
DEFAULT_WATCHDOG_S = 30  # the unit's WatchdogSec=


@runtime_checkable
class Heartbeat(Protocol):
    """What the watchdog needs of the engine controller: when its reconciler last turned (time.monotonic())."""

    def heartbeat(self) -> float: ...


@dataclass(frozen=True)
class Verdict:
    ok: bool
    reason: str


def timings(watchdog_usec: int) -> tuple[float, float]:
    """(ping interval, heartbeat age limit) for systemd's WatchdogSec: ping at half of it (sd_watchdog_enabled(3)
    advises so), and call the reconciler wedged past two thirds — a verdict then still reaches systemd in time."""
    period = watchdog_usec / 1e6
    return period / 2.0, period * 2.0 / 3.0


class Watchdog:
    """`tick()` decides one ping; `start()` runs it every `interval_s` on its own thread. The clock and the
    sender are injected, so tests drive it with a fake heartbeat and no sleeps."""

    def __init__(self, send: Callable[[str], bool], *, interval_s: float, stale_s: float,
                 engine: Heartbeat | None = None, alive: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._send, self.interval_s, self.stale_s = send, interval_s, stale_s
        self._engine, self._alive, self._clock = engine, alive, clock
        self._withheld: str | None = None  # why pings stopped ('' never: None while pinging)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def verdict(self) -> Verdict:
        try:
            if not self._alive():
                return Verdict(False, "the panel's page server is not running")
        except Exception as exc:  # a liveness check that fails is a failed check, said below
            return Verdict(False, f"the panel's liveness check failed: {type(exc).__name__}: {exc}")
        if self._engine is None:
            return Verdict(True, "panel alive (no engine controller)")
        try:
            age = self._clock() - self._engine.heartbeat()
        except Exception as exc:  # the controller itself is broken: as wedged as a stale heartbeat
            return Verdict(False, f"the engine reconciler's heartbeat could not be read: {type(exc).__name__}: {exc}")
        if age > self.stale_s:
            return Verdict(False, f"the engine reconciler last turned {age:.0f} s ago (limit {self.stale_s:.0f} s): "
                                  "it is wedged; systemd restarts the panel, the engine keeps serving")
        return Verdict(True, f"engine reconciler turned {age:.1f} s ago")

    def tick(self) -> bool:
        """One decision: ping when the check passes; log (once) when pings stop and when they resume."""
        v = self.verdict()
        if v.ok:
            if self._withheld is not None:
                oplog.decision("panel", "watchdog_resumed", who=oplog.PANEL, reason=v.reason)
                self._withheld = None
            self._send(PING)
            return True
        if self._withheld is None:
            oplog.decision("panel", "watchdog_withheld", who=oplog.PANEL, level=40, reason=v.reason)
            self._send("STATUS=" + v.reason)
        self._withheld = v.reason
        return False

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # the thread must outlive a bad tick; a dead thread means no pings anyway
                oplog.caught("panel", exc, "the watchdog's check", traceback=True)
            self._stop.wait(self.interval_s)

    def start(self) -> Watchdog:
        self._thread = threading.Thread(target=self._run, name="systemd-watchdog", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
