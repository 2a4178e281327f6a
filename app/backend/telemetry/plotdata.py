"""Shape timeline points into long-format rows for plotting (no pandas/Gradio here)."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from app.backend.telemetry.timeline import TimelinePoint

WINDOWS = MappingProxyType({"5 min": 300.0, "15 min": 900.0, "1 h": 3600.0, "6 h": 6 * 3600.0, "24 h": 86400.0})


@dataclass(frozen=True)
class PlotSpec:
    key: str
    title: str
    y_title: str
    series: tuple[tuple[str, str], ...]  # (TimelinePoint field, legend label)


# One quantity in one unit per plot (docs/telemetry.md): a shared axis flattens the smaller series.
# Decode and prompt tok/s differ by orders of magnitude, so they get an axis each too.
PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec("vram", "VRAM", "GiB", (("vram_used_gib", "used"), ("vram_total_gib", "total"))),
    PlotSpec("gpu", "GPU utilisation", "%", (("gpu_util", "util"),)),
    PlotSpec("power", "GPU power", "W", (("power_w", "power"),)),
    PlotSpec("temp", "GPU temperature", "°C", (("temp_c", "temperature"),)),
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


def thin(points: list[TimelinePoint], max_points: int = 300) -> list[TimelinePoint]:
    """Every n-th point so a plot never carries more than ~max_points per series."""
    if len(points) <= max_points:
        return points
    step = -(-len(points) // max_points)
    return points[::step] + ([points[-1]] if (len(points) - 1) % step else [])


def _value(p: TimelinePoint, name: str) -> float | None:
    if name == "ttft_ms":
        return p.ttft_p50_s * 1000 if p.ttft_p50_s is not None else None
    value = getattr(p, name)
    return None if value is None else float(value)


def rows(points: list[TimelinePoint], spec: PlotSpec, now: float | None = None) -> list[dict[str, object]]:
    """[{"time": ts, "series": label, "value": v, "profile": p}, …]; missing values are skipped.

    Every series also gets one placeholder row (value None) so the plot's legend/colour domain always
    holds all series: Gradio 6.31's LinePlot fixes its colour domain when it (re)builds the chart, and a
    series absent at that moment would never be drawn later.
    """
    t0 = points[0].ts if points else (now or 0.0)
    out: list[dict[str, object]] = [{"time": t0, "series": label, "value": None, "profile": ""} for _, label in spec.series]
    for p in points:
        for name, label in spec.series:
            v = _value(p, name)
            if v is not None:
                out.append({"time": p.ts, "series": label, "value": float(v), "profile": p.profile or "—"})
    return out
