"""Header strip shown above every tab: engine state + profile, VRAM bar, decode tok/s, pool coverage,
alert count. It reads only cached values (the engine watch's snapshot, `state.telemetry.latest()`); the page
feed (app.backend.web.pagefeed) sends its HTML again only when it changed, and the page script draws it."""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.state import AppState
from app.backend.telemetry.sampler import TelemetryFrame
from app.backend.contracts import GiB
from app.ui.shell import Shell
from app.ui.theme import BAD, GOOD, INFO, SEVERITY_COLOURS, STATE_COLOURS
CELL = "display:flex;flex-direction:column;gap:2px;min-width:120px"
LABEL = "font-size:11px;text-transform:uppercase;letter-spacing:.04em;opacity:.7"
VALUE = "font-size:16px;font-weight:600;font-variant-numeric:tabular-nums"


def _e(x: Any) -> str:
    return html.escape(str(x))


def _profile_label(state: AppState, profile_id: str | None) -> str:
    """"#2 quality / speed (balanced)", custom profiles too (the one registry: app.backend.profiles.registry)."""
    return state.profiles.label(profile_id)


def _vram_cell(frame: TelemetryFrame | None) -> str:
    if frame is None or not frame.gpus:
        why = frame.gpu_error if frame is not None and frame.gpu_error else "sampling…"
        return (f'<div style="{CELL}" data-testid="hdr-vram"><span style="{LABEL}">VRAM</span>'
                f'<span style="font-size:13px" data-vram="na">{_e(why)}</span></div>')
    # as shown (0.1 GiB): the strip is sent to the page only when what it shows changed (the page feed), and
    # the GPU's memory moves in its hundredths every second
    used, total = round(frame.vram_used_gib or 0.0, 1), round(frame.vram_total_gib or 0.0, 1)
    pct = 100.0 * used / total if total else 0.0
    colour = BAD if pct > 98 else INFO  # the card itself runs at 97.7%: only >98% is a warning
    sim = (' <span style="background:#805ad5;color:#fff;border-radius:3px;padding:0 4px;font-size:10px">SIMULATED</span>'
           if frame.gpu_simulated else "")
    return (
        f'<div style="{CELL};min-width:220px" data-testid="hdr-vram" data-vram-used="{used:.1f}" data-vram-total="{total:.1f}">'
        f'<span style="{LABEL}">VRAM{sim}</span>'
        f'<span style="{VALUE}">{used:.1f} / {total:.1f} GiB</span>'
        f'<div style="height:6px;background:rgba(127,127,127,.25);border-radius:3px;overflow:hidden">'
        f'<div style="width:{min(pct, 100):.1f}%;height:100%;background:{colour}"></div></div></div>'
    )


def header_html(state: AppState, snap: EngineSnapshot | None, frame: TelemetryFrame | None) -> str:
    """Pure formatting (tested without a browser)."""
    box = state.box
    gpu = box.gpus[0] if box is not None and len(box.gpus) > 1 else None  # several GPUs: the cell's GPU
    return _strip(_engine_cell(state, snap, gpu), _telemetry_cells(frame) + gpus_cell(state, frame))


def gpus_cell(state: AppState, frame: TelemetryFrame | None) -> str:
    """A box of several GPUs (docs/engine.md "Several GPUs"): every GPU's engine state, profile, VRAM (as
    nvidia-smi shows it) and decode speed; "" on a one-GPU box. The Decode cell beside is GPU 0's engine."""
    box = state.box
    if box is None or len(box.gpus) < 2:
        return ""
    vram = {g.index: g for g in (frame.gpus if frame is not None else ())}
    speed = {e.gpu: e.decode_tok_s for e in (frame.per_gpu if frame is not None else ())}
    parts = []
    for r in box.rows():
        g = vram.get(r.gpu)
        mem = f" · {g.memory_in_use / GiB:.1f}/{g.memory_total / GiB:.0f} GiB" if g is not None else ""
        tok = speed.get(r.gpu)
        tok_s = "" if tok is None or r.snapshot.state is not EngineState.READY else f" · {tok:.1f} tok/s"
        parts.append(f'<span data-testid="hdr-gpu" data-gpu="{r.gpu}" data-state="{r.snapshot.state.value}"'
                     f' data-decode="{"" if tok is None else f"{tok:.1f}"}">'
                     f'GPU {r.gpu} <span style="color:{STATE_COLOURS[r.snapshot.state]}">●</span> '
                     f'{_e(r.snapshot.state.value)} {_e(r.snapshot.profile_id or "")}{mem}{tok_s}</span>')
    return (f'<div style="{CELL}" data-testid="hdr-gpus"><span style="{LABEL}">GPUs</span>'
            f'<span style="font-size:12px">{"<br>".join(parts)}</span></div>')


def _strip(engine: str, telemetry: str) -> str:
    return ('<div id="moet-header-strip" style="display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start;'
            'padding:8px 12px;border:1px solid rgba(127,127,127,.3);border-radius:8px">'
            f"{engine}{telemetry}</div>")


def _engine_cell(state: AppState, snap: EngineSnapshot | None, gpu: int | None = None) -> str:
    snap = snap or EngineSnapshot()
    colour = STATE_COLOURS[snap.state]
    sim = (f", GPU {gpu}" if gpu is not None else "") + (" (SIMULATED)" if snap.simulated else "")
    # the phase only when it says more than the state (issue 49: "stopping · stopping")
    phase = (f" · {_e(snap.phase)}" if snap.phase and snap.state is not EngineState.READY
             and snap.phase != snap.state.value else "")
    engine = (
        f'<div style="{CELL};min-width:200px" data-testid="hdr-engine" data-state="{snap.state.value}">'
        f'<span style="{LABEL}">Engine{sim}</span>'
        f'<span style="{VALUE}"><span style="color:{colour}">●</span> {_e(snap.state.value)}{phase}</span>'
        f'<span style="font-size:12px">{_e(_profile_label(state, snap.profile_id))}'
        + (f' · <span data-build="{_e(snap.build)}">build {_e(snap.build)}</span>' if snap.build else "")
        + '</span></div>'
    )
    return engine


def _telemetry_cells(frame: TelemetryFrame | None) -> str:
    tok = frame.decode_tok_s if frame is not None else None
    tok_s = "—" if tok is None else f"{tok:.1f}"
    which = f"Decode, GPU {frame.per_gpu[0].gpu}" if frame is not None and frame.per_gpu else "Decode"  # several GPUs
    decode = (f'<div style="{CELL}" data-testid="hdr-decode" data-decode="{tok_s}"><span style="{LABEL}">{which}</span>'
              f'<span style="{VALUE}">{tok_s} tok/s</span></div>')
    cov = frame.coverage_pct if frame is not None else None
    if frame is not None and not frame.trace.understood:  # a build whose pool lines the parser cannot read
        cov_s, pool_note = "?", "this build's pool trace is not understood"
    elif frame is not None and frame.trace.pool_disabled:
        cov_s, pool_note = "0", "pool absent"
    elif frame is None or cov is None:
        cov_s, pool_note = "—", "no trace tick yet"
    else:
        cov_s = f"{cov:.1f}"
        pool_note = "last measured (engine idle)" if frame.pool_idle_s is not None else "routings served at FP4"
    coverage = (f'<div style="{CELL};min-width:170px" data-testid="hdr-coverage" data-coverage="{cov_s}" '
                f'title="Share of token→expert routings served at native FP4 (the card: ~57%)">'
                f'<span style="{LABEL}">Pool coverage</span><span style="{VALUE}">{cov_s}%</span>'
                f'<span style="font-size:11px;opacity:.7">{pool_note}</span></div>')
    alerts = frame.alerts if frame is not None else ()
    worst = alerts[0].severity if alerts else ""
    a_col = SEVERITY_COLOURS.get(worst, GOOD)
    titles = "; ".join(a.title for a in alerts) or "no alerts"
    alert = (f'<div style="{CELL}" data-testid="hdr-alerts" data-alerts="{len(alerts)}" title="{_e(titles)}">'
             f'<span style="{LABEL}">Alerts</span><span style="{VALUE};color:{a_col}">{len(alerts)}'
             f'{" " + _e(worst) if worst else ""}</span></div>')
    return f"{_vram_cell(frame)}{decode}{coverage}{alert}"


def render(state: AppState, shell: Shell) -> None:
    """Called by app.ui.app above the tabs. Drawn by the page feed itself (Shell.live): sent to a page only
    when the strip's HTML changed (an engine change event, a figure as shown), with no Gradio event."""

    def now() -> str:
        snap = shell.engine_now()[1]
        frame = state.telemetry.latest() if state.telemetry is not None else None
        return header_html(state, snap, frame)

    gr.HTML(shell.live("moet-header-live", now), elem_id="moet-header")
