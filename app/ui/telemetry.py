"""Telemetry tab: live plots (VRAM, GPU, pool coverage, churn/H2D, tok/s & TTFT, KV) over a chosen
window, GPU/host/pool details, and the alerts with what they mean and what to do.
Only reads `state.telemetry` caches; the page feed drives it (app.ui.shell)."""

from __future__ import annotations

import html
import json
import time
from collections.abc import Sequence
from typing import Any

import gradio as gr

from app.backend.state import AppState
from app.backend.alerts.rules import Alert
from app.backend.telemetry.sampler import TelemetryFrame
from app.backend.contracts import EngineState, count_text
from app.backend.telemetry.livefeed import DEFAULT_WINDOW, TelemetryStream
from app.backend.telemetry.plotdata import PLOTS, WINDOWS, PlotSpec, Span, columns, events, plots_for, spans
from app.backend.telemetry.timeline import TimelinePoint
from app.backend.contracts import GiB
from app.ui.shell import Shell
from app.ui.theme import SEVERITY_COLOURS, STATE_COLOURS

TITLE = "Telemetry"


def _e(x: Any) -> str:
    return html.escape(str(x))


def _n(v: Any, fmt: str = "{:.1f}", unit: str = "") -> str:
    return "N/A" if v is None else fmt.format(v) + unit


def _pair(a: Any, b: Any, fmt: str = "{:.3f}", unit: str = "") -> str:
    """`0.021/0.045 s`; `N/A` once when neither is known (issue 49: "N/A/N/A")."""
    return "N/A" if a is None and b is None else f"{_n(a, fmt)}/{_n(b, fmt)}{unit}"


def _mib_s(bytes_per_s: float | None) -> str:
    return _n(None if bytes_per_s is None else bytes_per_s / 2**20)


def _hms(ts: float) -> str:
    # the plots' x axis shows the UTC clock digits (naive datetimes from pandas): the band names the same
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def events_html(pts: list[TimelinePoint], window: tuple[float, float] | None = None) -> str:
    """The engine's states along the plots' time axis as a labelled band, with its stop / start / switch
    events (issue 29; docs/telemetry.md, "Gaps and engine events"). Same points as the plots; `window`: the
    plots' time range (start, end), so the band lines up with them (before the first sample: no data)."""
    ss = spans(pts)
    if not ss:
        return '<div id="telemetry-events" data-events="0"></div>'
    t0, t1 = ss[0].start, max(ss[-1].end, ss[0].start + 1)
    cells = []
    if window is not None and window[0] < t0:
        t0, t1 = window[0], max(window[1], t1)
        ss = [Span(t0, ss[0].start, "", ""), *ss]
    for i, sp in enumerate(ss):
        end = ss[i + 1].start if i + 1 < len(ss) else sp.end
        width = max((end - sp.start) / (t1 - t0) * 100, 0.4)
        try:
            colour = STATE_COLOURS[EngineState(sp.state)]
        except ValueError:
            colour = ""
        fill = (f"background:{colour}" if colour else
                "background:repeating-linear-gradient(45deg,#a0aec0 0 4px,transparent 4px 8px)")
        what = f"{sp.state or 'no data'}{f' · {sp.profile}' if sp.profile else ''}"
        cells.append(f'<span data-state="{_e(sp.state or "none")}" title="{_e(what)} {_hms(sp.start)}–{_hms(end)}" '
                     f'style="display:inline-block;height:10px;width:{width:.2f}%;{fill}"></span>')
    evs = events(pts)
    names = " · ".join(f'<span data-event="{_e(e.kind)}"><b>{_hms(e.ts)}</b> {_e(e.text)}</span>' for e in evs)
    return (f'<div id="telemetry-events" data-events="{len(evs)}" style="font-size:12px;margin:4px 0 8px">'
            f'<div aria-hidden="true" style="display:flex;width:100%;border-radius:3px;overflow:hidden">{"".join(cells)}'
            f'</div><div style="display:flex;justify-content:space-between;opacity:.8"><span>{_hms(t0)}</span>'
            f"<span>engine state along the plots' time axis (green ready · amber starting · grey stopped · "
            f"hatched no data); lines break where a figure has no data</span><span>{_hms(t1)}</span></div>"
            f'<div>{names or "no engine stop, start or switch in this window"}</div></div>')


def alerts_html(alerts: tuple[Alert, ...]) -> str:
    if not alerts:
        return '<div id="telemetry-alerts" data-alerts="0">No alerts.</div>'
    items = "".join(
        f'<li data-alert="{_e(a.id)}" style="margin-bottom:8px"><b style="color:{SEVERITY_COLOURS[a.severity]}">'
        f"[{_e(a.severity)}] {_e(a.title)}</b><br><span><b>What it means:</b> {_e(a.meaning)}</span><br>"
        f"<span><b>What to do:</b> {_e(a.action)}</span>"
        + (f'<br><code style="font-size:11px">{_e(a.evidence)}</code>' if a.evidence else "") + "</li>"
        for a in alerts
    )
    return f'<div id="telemetry-alerts" data-alerts="{len(alerts)}"><ul style="padding-left:18px">{items}</ul></div>'


def details_html(frame: TelemetryFrame) -> str:
    parts = []
    if not frame.gpus:
        parts.append(f"<b>GPU:</b> {_e(frame.gpu_error or 'sampling…')}")
    for g in frame.gpus:
        sim = " <b>SIMULATED</b>" if g.simulated and "SIMULATED" not in g.name else ""
        procs = ", ".join(
            f"{p.pid} {_e(p.name or '?')} {_n(p.used_bytes / GiB if p.used_bytes is not None else None, '{:.1f}', ' GiB')}"
            + (f" [{_e(p.container)}]" if p.container else "") for p in g.processes) or "none"
        parts.append(
            f"<b>GPU {g.index}: {_e(g.name)}</b>{sim} — VRAM used {g.memory_used / GiB:.2f} + reserved "
            f"{g.memory_reserved / GiB:.2f} of {g.memory_total / GiB:.1f} GiB · util {_n(g.util_gpu, '{:.0f}', '%')} · "
            f"power {_n(g.power_w, '{:.0f}')}/{_n(g.power_limit_w, '{:.0f}', ' W')} · {_n(g.temperature_c, '{:.0f}', ' °C')} · "
            f"SM {_n(g.sm_clock_mhz, '{}')} / mem {_n(g.mem_clock_mhz, '{}', ' MHz')} · throttle "
            f"{_e(', '.join(g.throttle_reasons) or 'none')} · PCIe tx/rx {_n(g.pcie_tx_kbs, '{:.0f}')}/"
            f"{_n(g.pcie_rx_kbs, '{:.0f}', ' KB/s')} · ECC {'N/A' if g.ecc_current is None else ('on' if g.ecc_current else 'off')}"
            f"<br>processes: {procs}"
        )
    t = frame.trace
    p = t.primary
    if not t.understood:
        parts.append(f"<b>Pool</b>: this build's pool trace is not understood (a line of a form this panel cannot "
                     f"read: <code>{_e(t.unknown_form or '')}</code>) — no pool figure is shown rather than a wrong one")
    elif p is not None and p.last is not None:
        s = p.last
        parts.append(
            f"<b>Pool</b> ({count_text(len(t.ranks), 'rank')}, tick {s.tick}): {s.cached}/{s.slots} slots filled · experts resident "
            f"{s.covered}/{s.total} ({s.covered_pct}%) · coverage {s.hit_tokens_pct}% tokens / {s.hit_experts_pct}% "
            f"experts · window +{s.win_promoted}/-{s.win_evicted} · cumulative +{s.cum_promoted}/-{s.cum_evicted} · "
            f"churn {_n(frame.churn_per_s, '{:.0f}', ' slots/s')} · est. H2D {_n(frame.h2d_gib_s, '{:.2f}', ' GiB/s')}"
            + (f" · <i>idle: no tick line for {frame.pool_idle_s:.0f} s (figures are the last measured)</i>"
               if frame.pool_idle_s is not None else ""))
    elif t.sizing is not None:
        parts.append(f"<b>Pool</b>: {t.sizing.slots} slots × {t.sizing.slot_mib} MiB; no tick summary yet "
                     "(summaries print only while tokens flow)")
    else:
        parts.append("<b>Pool</b>: no pool lines from the engine yet")
    m = frame.metrics
    whose = f", GPU {frame.per_gpu[0].gpu}'s engine" if frame.per_gpu else ""  # several GPUs: the pool and metrics
    if frame.per_gpu:
        parts.append("<b>Engines per GPU</b>: " + " · ".join(
            f"GPU {e.gpu} {_e(e.state.value)} {_e(e.profile or '')} {_n(e.decode_tok_s, '{:.1f}', ' tok/s')}"
            for e in frame.per_gpu))
    if m is not None:
        parts.append(
            f"<b>Engine /metrics{whose}</b>: decode {_n(m.decode_tok_s, '{:.1f}', ' tok/s')} · prompt "
            f"{_n(m.prompt_tok_s, '{:.0f}', ' tok/s')} · TTFT p50/p95 {_pair(m.ttft_p50_s, m.ttft_p95_s, unit=' s')} · "
            f"ITL p50/p95 {_pair(m.itl_p50_s, m.itl_p95_s, unit=' s')}"
            f" · KV {_n(m.kv_usage_pct, '{:.1f}', '%')} · running {_n(m.running, '{:.0f}')} · waiting "
            f"{_n(m.waiting, '{:.0f}')}" + (f" · <i>{_e(m.error)}</i>" if m.error else ""))
    h = frame.host
    if h is not None:
        parts.append(
            f"<b>Host</b>: CPU {_n(h.cpu_pct, '{:.0f}', '%')} · RAM {_n(h.ram_used_pct, '{:.0f}', '%')} of "
            f"{h.ram_total / GiB:.0f} GiB · swap {h.swap_used / GiB:.1f}/{h.swap_total / GiB:.1f} GiB · data-dir disk free "
            f"{_n(h.disk_free / GiB if h.disk_free is not None else None, '{:.0f}', ' GiB')} · disk r/w "
            f"{_mib_s(h.disk_read_bps)}/{_mib_s(h.disk_write_bps)} MiB/s"
            f" · net rx/tx {_mib_s(h.net_rx_bps)}/{_mib_s(h.net_tx_bps)} MiB/s")
    return '<div id="telemetry-details" style="font-size:13px;line-height:1.6">' + "<br>".join(parts) + "</div>"


def render(state: AppState, shell: Shell) -> None:
    hub = state.telemetry
    if hub is None:
        gr.Markdown("Telemetry is not running.")
        return
    with gr.Row():
        # interactive: no Gradio event listens to it (the page script reads it), so Gradio would disable it
        gr.Radio(list(WINDOWS), value=DEFAULT_WINDOW, label="Time window", elem_id="telemetry-window", interactive=True)
    # Everything here is pushed by the page feed, only while this tab is shown (issue 42, docs/telemetry.md
    # "Live plots"): the alerts and details as HTML when they change; the plots' points (the window once, then
    # only new samples) and the event band on this page's own stream (app.backend.telemetry.livefeed), drawn
    # with dygraphs by assets/js/telemetry-plots.js. No Gradio event runs for this tab.
    gr.HTML(shell.live("telemetry-alerts-live", lambda: alerts_html(hub.latest().alerts)), elem_id="telemetry-alerts-box")
    gr.HTML(shell.live("telemetry-details-live", lambda: details_html(hub.latest())), elem_id="telemetry-details-box")
    gr.HTML('<div id="telemetry-events-live"></div>', elem_id="telemetry-events-box")
    gr.HTML(plots_html(plots_for(hub.engine_gpus)), elem_id="telemetry-plots-box")
    shell.stream(lambda query: TelemetryStream(hub, query.get("window", DEFAULT_WINDOW), events_html))


def plots_html(plots: Sequence[PlotSpec] = PLOTS) -> str:
    """The plots' frame: one box per PlotSpec (its label with title, unit and colours), filled by the page
    script from the stream's rows (`plotdata.columns()` order: `data-cols` are this plot's columns). A box of
    several GPUs adds the per-GPU plots (`plotdata.plots_for`)."""
    cols = columns(plots)
    boxes = []
    for spec in plots:
        idx = [i + 1 for i, (key, _) in enumerate(cols) if key == spec.key]
        meta = {"labels": [label for _, label in spec.series], "cols": idx, "unit": spec.y_title,
                "colors": [PALETTE[i % len(PALETTE)] for i in range(len(spec.series))],
                "integer": spec.y_title == "count"}  # whole ticks from 0 (issue 49: requests at 0, 0.2 … 1)
        boxes.append(
            f'<div class="moet-plot" style="min-width:240px;flex:1 1 30%;border:1px solid rgba(127,127,127,.3);'
            f'border-radius:8px;padding:6px 8px">'
            f'<div style="font-size:13px;font-weight:600;margin-bottom:4px">{_e(_label(spec))}</div>'
            f'<div id="telemetry-plot-{spec.key}" data-plot="{_e(json.dumps(meta))}" style="height:240px;position:relative">'
            f'<div class="moet-plot-empty" style="position:absolute;inset:0;display:flex;align-items:center;'
            f'justify-content:center;opacity:.7;font-size:13px">no data yet</div></div></div>')
    return (f'<div id="telemetry-plots" style="display:flex;flex-wrap:wrap;gap:12px">{"".join(boxes)}</div>')


# eight: a line per GPU on an 8-GPU box
PALETTE = ("#3182ce", "#dd6b20", "#38a169", "#805ad5", "#d53f8c", "#319795", "#b7791f", "#4a5568")
PALETTE_NAMES = ("blue", "orange", "green", "purple", "pink", "teal", "gold", "grey")


def _colours(spec: PlotSpec) -> dict[str, str]:
    return {label: PALETTE[i % len(PALETTE)] for i, (_, label) in enumerate(spec.series)}


def _label(spec: PlotSpec) -> str:
    """Title, unit and — with more than one series — which colour is which (Vega's legend does not fit
    a chart this narrow)."""
    if len(spec.series) == 1:
        return f"{spec.title}, {spec.y_title}"
    key = " · ".join(f"{PALETTE_NAMES[i % len(PALETTE)]} {label}" for i, (_, label) in enumerate(spec.series))
    return f"{spec.title}, {spec.y_title} ({key})"
