"""The panel's counters (the gate's refusal statuses by reason) and the engine's, read from its snapshot."""

from __future__ import annotations

from dataclasses import replace

from app.backend.contracts import EngineSnapshot
from app.backend.prometheus.collector import CanaryReading, engine_extras
from app.backend.prometheus.counters import PanelCounters


def test_engine_extras_come_from_the_snapshot() -> None:
    """Restarts, switches by result and the canary are the snapshot's counts (one source of truth)."""
    snap = replace(EngineSnapshot(), restarts_total=3, switches_ok=2, switches_rolled_back=1, switches_failed=4,
                   switches_cancelled=5, canary_ok=False, canary_at=1700000000.0, canary_latency_s=1.5,
                   canary_failures_total=2)
    e = engine_extras(snap)
    assert e.restarts_total == 3
    assert e.switches == {"ok": 2, "rolled_back": 1, "failed": 4, "cancelled": 5}
    assert e.canary == CanaryReading(False, 1700000000.0, 1.5, 2)
    assert engine_extras(EngineSnapshot()).canary is None  # no canary judged yet: the series stay absent


def test_refusals_by_reason() -> None:
    c = PanelCounters()
    for status in (421, 421, 403, 400, 404, 405, 401, 413, 418):
        c.refused(status)
    assert c.refusals() == {"host": 2, "origin": 1, "forwarding_header": 1, "unused_route": 1, "method": 1,
                            "no_session": 1, "body_too_large": 1, "other": 1}
