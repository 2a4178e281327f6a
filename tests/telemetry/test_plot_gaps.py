"""Telemetry plots break their lines where there is no data and name the engine's stop / start / switch
(issue 29: "4 minutes of a stopped engine drawn as a rising copy rate and a flat TTFT")."""

from __future__ import annotations

from app.backend.telemetry.plotdata import PLOTS, events, rows, spans
from app.backend.telemetry.timeline import TimelinePoint

SPEC = {s.key: s for s in PLOTS}


def _journey() -> list[TimelinePoint]:
    """1 Hz: 60 s ready on balanced, 240 s stopped, 10 s starting, 60 s ready on balanced, then a switch."""
    pts, t = [], 1000.0
    for state, profile, n in (("ready", "balanced", 60), ("stopped", "", 240), ("starting", "balanced", 10),
                              ("ready", "balanced", 60), ("starting", "speed", 5), ("ready", "speed", 30)):
        for _ in range(n):
            ready = state == "ready"
            # what a stopped engine leaves: the GPU still read, the last measured pool figures, no /metrics
            pts.append(TimelinePoint(ts=t, profile=profile, engine_state=state, vram_used_gib=90.0 if ready else 1.0,
                                     h2d_gib_s=0.5 + (t - 1000) / 1000, ttft_p50_s=0.05 if ready else None))
            t += 1.0
    return pts


def _segments(rs: list[dict], label: str) -> list[tuple[float, float]]:
    """The drawn stretches of one series: consecutive valued rows, split at None rows (Vega's breaks)."""
    segs: list[list[float]] = []
    cur: list[float] = []
    for r in sorted((r for r in rs if r["series"] == label), key=lambda r: r["time"]):
        if r["value"] is None:
            if cur:
                segs.append(cur)
            cur = []
        else:
            cur.append(r["time"])
    if cur:
        segs.append(cur)
    return [(s[0], s[-1]) for s in segs]


def test_engine_figures_break_over_a_stopped_engine_and_gpu_figures_do_not() -> None:
    pts = _journey()
    h2d = _segments(rows(pts, SPEC["h2d"]), "H2D")
    assert h2d == [(1000.0, 1059.0), (1310.0, 1369.0), (1375.0, 1404.0)], h2d  # no ramp over the stop
    ttft = _segments(rows(pts, SPEC["ttft"]), "TTFT p50")
    assert ttft == [(1000.0, 1059.0), (1310.0, 1369.0), (1375.0, 1404.0)], ttft
    vram = _segments(rows(pts, SPEC["vram"]), "used")
    assert vram == [(1000.0, 1404.0)], vram  # the GPU was read all along: one line


def test_a_hole_in_the_samples_breaks_every_line() -> None:
    pts = [p for p in _journey() if not 1100 <= p.ts < 1200]  # the panel was down for 100 s
    assert _segments(rows(pts, SPEC["vram"]), "used") == [(1000.0, 1099.0), (1200.0, 1404.0)]


def test_stop_start_and_switch_are_named_on_the_time_axis() -> None:
    got = [(e.ts, e.kind, e.text) for e in events(_journey())]
    assert got == [(1060.0, "stop", "stopped"), (1300.0, "start", "start balanced"),
                   (1310.0, "ready", "ready balanced"), (1370.0, "start", "start speed"),
                   (1375.0, "ready", "ready speed")], got
    assert [s.state for s in spans(_journey())] == ["ready", "stopped", "starting", "ready", "starting", "ready"]
    holed = [p for p in _journey() if not 1100 <= p.ts < 1200]
    kinds = [e.kind for e in events(holed)]
    assert kinds[:3] == ["stop", "no data", "data again"], kinds
