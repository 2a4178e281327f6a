"""The Telemetry tab's part of the page feed (issue 42; docs/telemetry.md, "Live plots"): per open page
showing the tab, the window's samples once, then only the samples that are new, and the engine-event band
when it changed. The page draws them with dygraphs (a canvas library for streaming time series, Debian's
libjs-dygraphs, served by the panel: app.backend.web.pagefeed.AssetRoute)."""

from __future__ import annotations

import time
from collections.abc import Callable

from app.backend.telemetry.sampler import TelemetrySampler
from app.backend.telemetry.plotdata import WINDOWS, gap_threshold, plots_for, thin, wide
from app.backend.telemetry.timeline import TimelinePoint

DEFAULT_WINDOW = "15 min"
THIN_TO = 300  # points per plot at most when a window is (re)sent


class TelemetryStream:
    """One page's stream: `poll()` → the message part to send now, or None (nothing new)."""

    def __init__(self, hub: TelemetrySampler, window: str,
                 band: Callable[[list[TimelinePoint], tuple[float, float]], str]) -> None:
        self.hub = hub
        self.window_s = WINDOWS.get(window, WINDOWS[DEFAULT_WINDOW])
        self.band = band
        self.last: TimelinePoint | None = None
        self.started = False
        self.window_pts: list[TimelinePoint] = []
        self.band_sent = ""
        self.gap = 5.0
        self.plots = plots_for(hub.engine_gpus)  # a box of several GPUs: the per-GPU plots too

    def poll(self) -> dict[str, object] | None:
        part: dict[str, object] = {}
        if not self.started:  # the window once (thinned: a plot never holds more than ~300 points of it)
            window = thin(self.hub.series(self.window_s), THIN_TO)
            self.gap = gap_threshold(window)
            part["plot"] = {"window_s": self.window_s, "reset": True, "rows": wide(window, gap=self.gap, plots=self.plots)}
            self.started = True
            new = window
        else:  # then only what is new
            since = self.last.ts if self.last is not None else 0.0
            new = [p for p in self.hub.timeline.points(since) if p.ts > since]
            if not new:
                return None
            part["plot"] = {"window_s": self.window_s, "reset": False, "rows": wide(new, self.last, gap=self.gap, plots=self.plots)}
            # the band's points: the window kept here (a long window is not read from SQLite each second)
            cut = time.time() - self.window_s
            window = [p for p in self.window_pts if p.ts >= cut] + new
            if len(window) > 2 * THIN_TO:
                window = thin(window, THIN_TO)
        self.window_pts = window
        if new:
            self.last = new[-1]
        now = time.time()
        band = self.band(window, (now - self.window_s, now))
        if band != self.band_sent:
            part["html"] = {"telemetry-events-live": band}
            self.band_sent = band
        return part
