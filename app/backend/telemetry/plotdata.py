"""Shape timeline points into long-format rows for plotting (no pandas/Gradio here)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise
from types import MappingProxyType

from app.backend.telemetry.timeline import TimelinePoint

WINDOWS = MappingProxyType({"5 min": 300.0, "15 min": 900.0, "1 h": 3600.0, "6 h": 6 * 3600.0, "24 h": 86400.0})


@dataclass(frozen=True)
class PlotSpec:
    key: str
    title: str
    y_title: str
    series: tuple[tuple[str, str], ...]  # (TimelinePoint field, legend label)
    engine_only: bool = True  # a figure of the serving engine: no value while it is not ready (a gap, not a line)


# One quantity in one unit per plot (docs/telemetry.md): a shared axis flattens the smaller series.
# Decode and prompt tok/s differ by orders of magnitude, so they get an axis each too.
PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec("vram", "VRAM", "GiB", (("vram_used_gib", "used"), ("vram_total_gib", "total")), engine_only=False),
    PlotSpec("gpu", "GPU utilisation", "%", (("gpu_util", "util"),), engine_only=False),
    PlotSpec("power", "GPU power", "W", (("power_w", "power"),), engine_only=False),
    PlotSpec("temp", "GPU temperature", "°C", (("temp_c", "temperature"),), engine_only=False),
    PlotSpec("pool", "Pool coverage", "%",
             (("coverage_pct", "tokens"), ("expert_hit_pct", "experts"))),
    PlotSpec("churn", "Pool churn", "slots/s", (("churn_per_s", "churn"),)),
    PlotSpec("h2d", "Est. host→device copy", "GiB/s", (("h2d_gib_s", "H2D"),)),
    PlotSpec("kv", "KV-cache usage", "%", (("kv_usage_pct", "KV"),)),
    PlotSpec("speed", "Decode", "tok/s", (("decode_tok_s", "decode"),)),
    PlotSpec("prompt", "Prompt (prefill)", "tok/s", (("prompt_tok_s", "prompt"),)),
    PlotSpec("ttft", "Time to first token (p50)", "ms", (("ttft_ms", "TTFT p50"),)),
    PlotSpec("requests", "Requests", "count", (("running", "running"), ("waiting", "waiting"))),
)
PLOTS_PER_ROW = 3
# A box of several GPUs (docs/telemetry.md "Several GPUs"): these figures once more, one line per GPU's engine,
# read from TimelinePoint.per_gpu (its entry order: gpu, then these). The plots above follow GPU 0's engine.
PER_GPU = (("vram", "VRAM per GPU", "GiB", 1), ("util", "GPU utilisation per GPU", "%", 2),
           ("decode", "Decode per GPU", "tok/s", 3))


def plots_for(gpus: Sequence[int]) -> tuple[PlotSpec, ...]:
    """The plots of a box with these engines' GPUs: PLOTS, plus one plot per PER_GPU figure with a line per GPU
    when there are several (a per-GPU value is None while that GPU's engine does not serve, so no gating on GPU
    0's state)."""
    if len(gpus) < 2:
        return PLOTS
    return PLOTS + tuple(
        PlotSpec(f"gpus_{key}", title, unit, tuple((f"gpu.{g}.{key}", f"GPU {g}") for g in gpus), engine_only=False)
        for key, title, unit, _ in PER_GPU)


@lru_cache(maxsize=4096)
def _per_gpu(text: str) -> dict[tuple[int, str], float | None]:
    """TimelinePoint.per_gpu parsed once per distinct text: (gpu, figure) -> value."""
    out: dict[tuple[int, str], float | None] = {}
    try:
        entries = json.loads(text) if text else []
    except ValueError:
        return out
    for entry in entries:
        if isinstance(entry, list) and entry and isinstance(entry[0], int):
            for key, _, _, i in PER_GPU:
                v = entry[i] if i < len(entry) else None
                out[(entry[0], key)] = float(v) if isinstance(v, (int, float)) else None
    return out


def thin(points: list[TimelinePoint], max_points: int = 300) -> list[TimelinePoint]:
    """Every n-th point so a plot never carries more than ~max_points per series."""
    if len(points) <= max_points:
        return points
    step = -(-len(points) // max_points)
    return points[::step] + ([points[-1]] if (len(points) - 1) % step else [])


def _value(p: TimelinePoint, name: str) -> float | None:
    if name.startswith("gpu."):
        _, gpu, key = name.split(".")
        return _per_gpu(p.per_gpu).get((int(gpu), key))
    if name == "ttft_ms":
        return p.ttft_p50_s * 1000 if p.ttft_p50_s is not None else None
    value = getattr(p, name)
    return None if value is None else float(value)


GAP_MIN_S = 5.0  # a hole shorter than this is sampling jitter, not missing data
GAP_INTERVALS = 3.0  # ... and so is one shorter than this many typical sample intervals


def gap_threshold(points: list[TimelinePoint]) -> float:
    """Seconds between two samples of a series above which the line breaks (no data in between)."""
    steps = sorted(b.ts - a.ts for a, b in pairwise(points))
    typical = steps[len(steps) // 2] if steps else 1.0
    return max(GAP_MIN_S, GAP_INTERVALS * typical)


def rows(points: list[TimelinePoint], spec: PlotSpec, now: float | None = None) -> list[dict[str, object]]:
    """[{"time": ts, "series": label, "value": v, "profile": p}, …]; missing values are skipped.

    Every series also gets one placeholder row (value None) so the plot's legend/colour domain always
    holds all series: Gradio 6.31's LinePlot fixes its colour domain when it (re)builds the chart, and a
    series absent at that moment would never be drawn later.

    Where a series has no value for longer than `gap_threshold` (panel down, engine stopped or starting:
    an engine figure has no value then), a None row sits in the hole: Vega-Lite breaks the line at it
    instead of drawing a made-up ramp across (issue 29; docs/telemetry.md, "Gaps and engine events").
    """
    t0 = points[0].ts if points else (now or 0.0)
    out: list[dict[str, object]] = [{"time": t0, "series": label, "value": None, "profile": ""} for _, label in spec.series]
    gap = gap_threshold(points)
    last: dict[str, float] = {}
    for p in points:
        live = not spec.engine_only or p.engine_state == "ready"
        for name, label in spec.series:
            v = _value(p, name) if live else None
            if v is None:
                continue
            prev = last.get(label)
            if prev is not None and p.ts - prev > gap:
                out.append({"time": (prev + p.ts) / 2, "series": label, "value": None, "profile": ""})
            last[label] = p.ts
            out.append({"time": p.ts, "series": label, "value": float(v), "profile": p.profile or "—"})
    return out


@dataclass(frozen=True)
class Span:
    """A stretch of the time axis in one engine state ("" state = no samples at all: the panel was down)."""

    start: float
    end: float
    state: str
    profile: str


@dataclass(frozen=True)
class EngineEvent:
    ts: float
    kind: str  # "start" | "ready" | "stop" | "fail" | "switch" | "no data" | "data again"
    text: str


def spans(points: list[TimelinePoint]) -> list[Span]:
    """The window cut where the engine's state or profile changes, or where there are no samples."""
    out: list[Span] = []
    gap = gap_threshold(points)
    for prev, p in zip([None, *points], points, strict=False):
        if prev is not None and p.ts - prev.ts > gap:
            out.append(Span(prev.ts, p.ts, "", ""))
        cur = out[-1] if out else None
        if cur is not None and cur.state == p.engine_state and cur.profile == p.profile:
            out[-1] = Span(cur.start, p.ts, cur.state, cur.profile)
        else:
            out.append(Span(p.ts, p.ts, p.engine_state, p.profile))  # from its first sample
    return out


def events(points: list[TimelinePoint]) -> list[EngineEvent]:
    """Engine stop / start / switch (and sampling holes) on the time axis, oldest first."""
    out: list[EngineEvent] = []
    ss = spans(points)
    for a, b in pairwise(ss):
        if b.state == "":
            out.append(EngineEvent(b.start, "no data", "no samples (panel not running)"))
        elif a.state == "":
            out.append(EngineEvent(b.start, "data again", f"samples again, engine {b.state or 'unknown'}"))
        elif a.state == "ready" and b.state == "ready" and a.profile != b.profile:
            out.append(EngineEvent(b.start, "switch", f"switch {a.profile} → {b.profile}"))
        elif b.state in ("starting", "preflight") and a.state not in ("starting", "preflight"):
            out.append(EngineEvent(b.start, "start", f"start {b.profile}".strip()))
        elif b.state == "ready" and a.state != "ready":
            out.append(EngineEvent(b.start, "ready", f"ready {b.profile}".strip()))
        elif b.state == "stopped" and a.state != "stopped":
            out.append(EngineEvent(b.start, "stop", "stopped"))
        elif b.state == "failed":
            out.append(EngineEvent(b.start, "fail", "failed"))
        elif a.profile != b.profile and b.state not in ("stopped", ""):
            out.append(EngineEvent(b.start, "switch", f"switch {a.profile} → {b.profile}"))
    return out


def columns(plots: Sequence[PlotSpec] = PLOTS) -> list[tuple[str, str]]:
    """(plot key, series label) of every column after the time in `wide` rows, in the plots' order."""
    return [(spec.key, label) for spec in plots for _, label in spec.series]


def wide(points: list[TimelinePoint], after: TimelinePoint | None = None,
         gap: float | None = None, plots: Sequence[PlotSpec] = PLOTS) -> list[list[float | None]]:
    """One row per sample for the streamed plots (issue 42; docs/telemetry.md): [ts, then every plot's
    series in `columns()` order]; None where a figure has no value (an engine figure while the engine is not
    ready: a gap, as in `rows`). Where no sample came for longer than the gap threshold (the panel was down),
    a row of None sits in the hole, so the line breaks there. `after`: the last point already sent (the
    hole between it and the first new point is checked too)."""
    gap = gap if gap is not None else gap_threshold(points)
    out: list[list[float | None]] = []
    prev = after
    width = len(columns(plots))
    for p in points:
        if prev is not None and p.ts - prev.ts > gap:
            out.append([(prev.ts + p.ts) / 2, *([None] * width)])
        row: list[float | None] = [p.ts]
        for spec in plots:
            live = not spec.engine_only or p.engine_state == "ready"
            row.extend(_value(p, name) if live else None for name, _ in spec.series)
        out.append(row)
        prev = p
    return out
