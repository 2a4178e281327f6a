"""Telemetry tab: live plots (VRAM, GPU, pool coverage, churn/H2D, tok/s & TTFT, KV) over a chosen
window, GPU/host/pool details, and the alerts with what they mean and what to do.
Only reads `state.telemetry` caches; the shared page timer drives it."""

from __future__ import annotations

import html
import time
from typing import Any

import gradio as gr
import pandas as pd

from app.backend.state import AppState
from app.backend.telemetry.alerts import Alert
from app.backend.telemetry.hub import TelemetryFrame, TelemetryHub
from app.backend.contracts import EngineState
from app.backend.telemetry.plotdata import PLOTS, PLOTS_PER_ROW, WINDOWS, PlotSpec, events, rows, spans, thin
from app.backend.telemetry.timeline import TimelinePoint
from app.backend.units import GiB
from app.ui.shell import QUICK, Shell
from app.ui.theme import SEVERITY_COLOURS, STATE_COLOURS

TITLE = "Telemetry"


def _e(x: Any) -> str:
    return html.escape(str(x))


def _n(v: Any, fmt: str = "{:.1f}", unit: str = "") -> str:
    return "N/A" if v is None else fmt.format(v) + unit


def _mib_s(bytes_per_s: float | None) -> str:
    return _n(None if bytes_per_s is None else bytes_per_s / 2**20)


def _frame(pts: list[TimelinePoint], spec: PlotSpec) -> pd.DataFrame:
    df = pd.DataFrame(rows(pts, spec, now=time.time()), columns=["time", "series", "value", "profile"])
    df["time"] = pd.to_datetime(df["time"].astype(float), unit="s")
    df["value"] = df["value"].astype(float)  # never let an odd frame turn the y axis nominal
    return df


def frames(hub: TelemetryHub, window: str) -> list[pd.DataFrame]:
    pts = thin(hub.series(WINDOWS.get(window, 900)))
    return [_frame(pts, spec) for spec in PLOTS]


def _hms(ts: float) -> str:
    # the plots' x axis shows the UTC clock digits (naive datetimes from pandas): the band names the same
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def events_html(pts: list[TimelinePoint]) -> str:
    """The engine's states along the plots' time axis as a labelled band, with its stop / start / switch
    events (issue 29; docs/telemetry.md, "Gaps and engine events"). Same points as the plots."""
    ss = spans(pts)
    if not ss:
        return '<div id="telemetry-events" data-events="0"></div>'
    t0, t1 = ss[0].start, max(ss[-1].end, ss[0].start + 1)
    cells = []
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
            f"<b>Pool</b> ({len(t.ranks)} rank(s), tick {s.tick}): {s.cached}/{s.slots} slots filled · experts resident "
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
    if m is not None:
        parts.append(
            f"<b>Engine /metrics</b>: decode {_n(m.decode_tok_s, '{:.1f}', ' tok/s')} · prompt "
            f"{_n(m.prompt_tok_s, '{:.0f}', ' tok/s')} · TTFT p50/p95 {_n(m.ttft_p50_s, '{:.3f}')}/"
            f"{_n(m.ttft_p95_s, '{:.3f}', ' s')} · ITL p50/p95 {_n(m.itl_p50_s, '{:.3f}')}/{_n(m.itl_p95_s, '{:.3f}', ' s')}"
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
        window = gr.Radio(list(WINDOWS), value="15 min", label="Time window", elem_id="telemetry-window")
    alerts = gr.HTML(alerts_html(()), elem_id="telemetry-alerts-box")
    details = gr.HTML("", elem_id="telemetry-details-box")
    band = gr.HTML("", elem_id="telemetry-events-box")
    plots = []
    for start in range(0, len(PLOTS), PLOTS_PER_ROW):
        with gr.Row(equal_height=True):
            for spec in PLOTS[start:start + PLOTS_PER_ROW]:
                plots.append(_plot(spec))

    def tick(win: str) -> list[Any]:
        f = hub.latest()
        pts = thin(hub.series(WINDOWS.get(win, 900)))
        return [alerts_html(f.alerts), details_html(f), events_html(pts), *[_frame(pts, spec) for spec in PLOTS]]

    outs = [alerts, details, band, *plots]
    # Six re-drawn plots a second are not free (server DataFrames, browser Vega renders): this tab has
    # its own timer, running only while the tab is selected. The header uses the shared page timer.
    live = gr.Timer(1.0, active=False)
    live.tick(tick, inputs=[window], outputs=outs, trigger_mode="once", **QUICK)
    window.change(tick, inputs=[window], outputs=outs, show_progress="hidden")
    if shell.tabs is not None:
        shell.tabs.select(_on_tab, outputs=[live], show_progress="hidden")
    else:  # no tab container (tests / embedding): always live
        live.active = True


def _on_tab(evt: gr.SelectData) -> gr.Timer:
    return gr.Timer(active=evt.value == TITLE)


PALETTE = ("#3182ce", "#dd6b20", "#38a169", "#805ad5")
PALETTE_NAMES = ("blue", "orange", "green", "purple")


def _colours(spec: PlotSpec) -> dict[str, str]:
    return {label: PALETTE[i % len(PALETTE)] for i, (_, label) in enumerate(spec.series)}


def _label(spec: PlotSpec) -> str:
    """Title, unit and — with more than one series — which colour is which (Vega's legend does not fit
    a chart this narrow)."""
    if len(spec.series) == 1:
        return f"{spec.title}, {spec.y_title}"
    key = " · ".join(f"{PALETTE_NAMES[i % len(PALETTE)]} {label}" for i, (_, label) in enumerate(spec.series))
    return f"{spec.title}, {spec.y_title} ({key})"


def _plot(spec: PlotSpec) -> gr.LinePlot:
    return gr.LinePlot(
        None,  # filled by the first timer tick
        # Gradio 6.31's LinePlot fixes its colour domain when it builds the chart: every frame carries a
        # placeholder row per series (plotdata.rows) so no series is missing from it; the color_map keeps
        # each series' colour stable.
        # The title is the block's label (left, above the chart), not a Vega title: a chart title sat
        # under the plot's own fullscreen/export buttons.
        x="time", y="value", color="series", color_map=_colours(spec), label=_label(spec),
        show_label=True, y_title=spec.y_title, x_title=" ", color_title=" ",
        x_axis_format="%H:%M:%S", tooltip=["time", "series", "value", "profile"], height=260, min_width=240,
        elem_id=f"telemetry-plot-{spec.key}", buttons=["fullscreen"],
    )
