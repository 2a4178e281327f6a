"""The Telemetry tab's part of the page feed (issue 42): the window once, then only new samples; a hole in
the samples is a row of None (the line breaks); an engine figure is None while the engine is not ready."""

from __future__ import annotations

import time
from types import SimpleNamespace

from app.backend.telemetry.livefeed import TelemetryStream
from app.backend.telemetry.plotdata import columns, wide
from app.backend.telemetry.timeline import Timeline, TimelinePoint


def point(ts: float, state: str = "ready", **kw: float) -> TimelinePoint:
    return TimelinePoint(ts=ts, engine_state=state, profile="quality", vram_used_gib=90.0, ttft_p50_s=0.05, **kw)


def test_the_window_once_then_only_new_samples_and_the_band_when_it_changes() -> None:
    now = time.time()
    tl = Timeline()
    for i in range(10):
        tl.append(point(now - 20 + i))
    hub = SimpleNamespace(timeline=tl, series=lambda window_s: tl.points(time.time() - window_s), engine_gpus=[0])
    bands: list[int] = []

    def band(pts: list[TimelinePoint], window: tuple[float, float]) -> str:
        bands.append(len(pts))
        return f"<div>{pts[-1].engine_state if pts else ''}</div>"

    s = TelemetryStream(hub, "5 min", band)  # type: ignore[arg-type]
    first = s.poll()
    assert first is not None and first["plot"]["reset"] is True and len(first["plot"]["rows"]) == 10
    assert first["html"] == {"telemetry-events-live": "<div>ready</div>"}
    assert s.poll() is None  # nothing new: nothing to send
    tl.append(point(now - 9))
    nxt = s.poll()
    assert nxt is not None and nxt["plot"]["reset"] is False and len(nxt["plot"]["rows"]) == 1
    assert "html" not in nxt  # the band did not change
    tl.append(point(now - 8, state="stopped"))
    last = s.poll()
    assert last is not None and last["html"] == {"telemetry-events-live": "<div>stopped</div>"}
    ttft = [i for i, (key, _) in enumerate(columns()) if key == "ttft"][0] + 1
    vram = [i for i, (key, _) in enumerate(columns()) if key == "vram"][0] + 1
    row = last["plot"]["rows"][0]
    assert row[ttft] is None and row[vram] == 90.0  # an engine figure has no value while it is not ready


def test_a_hole_in_the_samples_is_a_row_of_none() -> None:
    rows = wide([point(100.0), point(101.0), point(102.0), point(200.0)])
    assert len(rows) == 5 and rows[3][0] == 151.0 and all(v is None for v in rows[3][1:])
