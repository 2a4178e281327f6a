"""systemd's watchdog (issue 39 item 6): WATCHDOG=1 is earned by the engine reconciler's heartbeat; a wedged
reconciler stops the pings (systemd then restarts the panel) and the operator's log says why; without an
engine controller the panel's own liveness earns them. A fake heartbeat and clock: no sleeps."""

from __future__ import annotations

import io
from dataclasses import dataclass

import pytest

from app.backend.service.watchdog import PING, Heartbeat, Watchdog, timings


@dataclass
class FakeEngine:
    beat: float = 0.0

    def heartbeat(self) -> float:
        return self.beat


@dataclass
class Clock:
    t: float = 100.0

    def __call__(self) -> float:
        return self.t


def test_pings_stop_when_the_reconciler_is_wedged_and_resume_when_it_turns(oplog_lines: io.StringIO) -> None:
    clock, engine, sent = Clock(), FakeEngine(beat=99.0), list[str]()
    assert isinstance(engine, Heartbeat)
    dog = Watchdog(lambda m: sent.append(m) or True, interval_s=15, stale_s=20, engine=engine, clock=clock)
    assert dog.tick() and sent == [PING]
    clock.t = 119.0  # 20 s since the last turn: still within the limit
    assert dog.tick()
    clock.t = 125.0  # 26 s: wedged
    assert not dog.tick()
    assert not dog.tick()
    assert sent.count(PING) == 2 and sent[-1].startswith("STATUS=the engine reconciler last turned 26 s ago")
    assert oplog_lines.getvalue().count("action=watchdog_withheld") == 1  # said once, not once per tick
    assert "wedged" in oplog_lines.getvalue()
    engine.beat = 124.5
    assert dog.tick() and sent[-1] == PING
    assert "action=watchdog_resumed" in oplog_lines.getvalue()


def test_a_broken_controller_is_as_wedged_as_a_stale_heartbeat() -> None:
    class Broken:
        def heartbeat(self) -> float:
            raise RuntimeError("lock poisoned")

    sent: list[str] = []
    dog = Watchdog(lambda m: sent.append(m) or True, interval_s=15, stale_s=20, engine=Broken(), clock=Clock())
    assert not dog.tick() and PING not in sent


def test_without_an_engine_controller_the_panel_liveness_earns_the_ping() -> None:
    alive = [True]
    sent: list[str] = []
    dog = Watchdog(lambda m: sent.append(m) or True, interval_s=15, stale_s=20, engine=None, alive=lambda: alive[0])
    assert dog.tick()
    alive[0] = False
    assert not dog.tick()
    assert sent == [PING, "STATUS=the panel's page server is not running"]


def test_timings_follow_watchdog_sec() -> None:
    assert timings(30_000_000) == (15.0, 20.0)


def test_env_names_the_watchdog_only_for_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from app.backend.config import env

    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert env.watchdog_usec() == 30_000_000
    monkeypatch.setenv("WATCHDOG_PID", "1")  # meant for another process (a parent's)
    assert env.watchdog_usec() is None
    monkeypatch.delenv("WATCHDOG_USEC")
    assert env.watchdog_usec() is None
