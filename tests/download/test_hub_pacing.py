"""The SIMULATED hub's caps (app/backend/simhub/pacing.py): a per-connection cap and one link shared by
every connection, which the download benchmark's capped scenarios stand on (docs/downloads.md)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from app.backend.simhub import pacing
from app.backend.simhub.pacing import BURST_S, Pacer, step_for

from .conftest import PREFIX, start_hub


class FakeClock:
    """time.monotonic / time.sleep on a virtual clock: `late` is added to every wake-up, as a busy box does."""

    def __init__(self, late: float = 0.0) -> None:
        self.now, self.late = 100.0, late

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s + self.late


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(pacing, "time", fake)
    return fake


def test_a_pacer_spaces_sends_at_its_rate(clock: FakeClock) -> None:
    p = Pacer(1_000_000)
    t0 = clock.now
    for _ in range(10):
        p.take(100_000)
    # the first send goes at once, each next one 0.1 s later: 0.9 s until the last one starts
    assert clock.now - t0 == pytest.approx(0.9)


def test_a_late_sender_catches_up_by_at_most_one_burst(clock: FakeClock) -> None:
    clock.late = 0.002  # every wake-up 2 ms late: without credit the rate would fall by 2 ms per send
    p = Pacer(1_000_000)
    t0 = clock.now
    for _ in range(50):
        p.take(10_000)  # 10 ms of the rate each
    elapsed = clock.now - t0
    assert elapsed == pytest.approx(0.49 + 0.002, abs=1e-9), "the credit absorbed every late wake-up"
    clock.now += 10.0  # idle for long: the credit is one burst, not ten seconds of the rate
    t1 = clock.now
    for _ in range(10):
        p.take(10_000)
    # the first send at once, the next nine 10 ms apart, less the one burst of credit, plus the last wake-up's lateness
    assert clock.now - t1 == pytest.approx(0.09 - BURST_S + 0.002, abs=1e-9)


def test_step_sizes_follow_the_cap() -> None:
    assert step_for(150_000) == 64 << 10, "small test caps: 64 KiB steps"
    assert step_for(50e6) == 250_000, "50 MB/s: ~5 ms of the cap per send"
    assert step_for(None) == step_for(10e9) == 1 << 20


def _get_range(url: str, start: int, end: int) -> bytes:
    r = httpx.get(url, headers={"Range": f"bytes={start}-{end}"}, follow_redirects=True, timeout=30)
    r.raise_for_status()
    return r.content


def test_the_link_is_shared_by_every_connection(artifact: Any) -> None:
    """Two connections at once through a 4 MB/s link: byte-identical bodies, and together no faster
    than the link (each alone is uncapped, so only the shared link can account for the time)."""
    link_bps = 4_000_000
    hub = start_hub(artifact, link_cap_bps=link_bps)
    try:
        part = artifact.files[PREFIX + "001"]
        size = part.stat().st_size
        url = f"{hub.endpoint}/moet-panel/simulated-cache/resolve/main/{part.name}"
        halves = [(0, size // 2 - 1), (size // 2, size - 1)]
        t0 = time.monotonic()
        with ThreadPoolExecutor(2) as pool:
            bodies = list(pool.map(lambda r: _get_range(url, *r), halves))
        elapsed = time.monotonic() - t0
        assert b"".join(bodies) == part.read_bytes()
        # the first step goes at once, every other byte waits for its slot on the link
        assert elapsed >= (size - step_for(link_bps)) / link_bps - BURST_S, (elapsed, size / link_bps)
    finally:
        hub.stop()


def test_the_simulated_servers_send_without_nagle() -> None:
    """Both doubles answer with TCP_NODELAY, as the real Hub's and vLLM's servers do: with Nagle, every
    answer's body waited ~40 ms for the client's delayed ACK of its headers (docs/downloads.md)."""
    from app.backend.simengine.handler import _Handler
    from app.backend.simhub.server import _HubHandler

    assert _HubHandler.disable_nagle_algorithm is True
    assert _Handler.disable_nagle_algorithm is True
