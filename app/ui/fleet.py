"""Fleet tab (a fleet's front only: its state dir holds a fleet file, docs/fleet.md): per box its state, slots,
answers in flight, the router's health of it, the profile each engine runs, VRAM and pool coverage.

Thin: the figures are the backend's (`state.front.view()`, refreshed on a thread every 2 s); the page feed redraws
the table when they changed (docs/ui-and-safety.md "The page feed"), no timer of its own."""

from __future__ import annotations

import html

import gradio as gr

from app.backend.fleet.service import FleetView
from app.backend.state import AppState
from app.ui.shell import Shell

TITLE = "Fleet"


def shown(state: AppState) -> bool:
    """Only a fleet's front has this tab: one box alone shows exactly the tabs it had."""
    return state.front is not None


def _num(v: float | None, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def fleet_html(view: FleetView) -> str:
    if not view.boxes:
        return "<p id='fleet-empty'>No boxes yet: <code>moet-panel fleet add NAME URL</code>.</p>"
    head = ("<tr><th>box</th><th>state</th><th>slots</th><th>in flight</th><th>router</th><th>profile per GPU</th>"
            "<th>VRAM used</th><th>pool coverage</th></tr>")
    rows = []
    for v in view.boxes:
        b, fig = v.box, v.figures
        state = ("serving" if b.serving else "draining" if b.draining else
                 b.error or b.state or "not serving")
        router = {True: "healthy", False: "unhealthy", None: "not listed"}[v.router_healthy]
        vram = (f"{_num(fig.vram_used_gib, '.1f')} / {_num(fig.vram_total_gib, '.1f')} GiB"
                if fig.vram_used_gib is not None else "—")
        cov = f"{fig.pool_coverage:.0%}" if fig.pool_coverage is not None else "—"
        profiles = ", ".join(fig.profiles) or ("—" if not fig.error else fig.error)
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(x))}</td>" for x in (
            b.name, state, b.slots, b.in_flight, router, profiles, vram, cov)) + "</tr>")
    router = f"router pid {view.router_pid}" if view.router_pid else "router not running (the panel restarts it)"
    return (f"<p id='fleet-router'>{html.escape(router)}; started {view.router_starts} time(s)</p>"
            f"<table class='moet-fleet' id='fleet-boxes'>{head}{''.join(rows)}</table>")


def render(state: AppState, shell: Shell) -> None:
    front = state.front
    assert front is not None
    gr.Markdown("The boxes behind this front: clients use this panel's gateway; vLLM's router spreads their "
                "requests over the boxes that serve (docs/fleet.md). `moet-panel fleet add|remove` changes them.")
    table = gr.HTML(fleet_html(front.view()), elem_id="fleet-table")

    def refresh() -> str:
        return fleet_html(front.view())

    shell.on_tick(refresh, None, [table])
    shell.version(refresh)  # what the table shows: redrawn only when a figure moved
    shell.on_tab(TITLE, refresh, None, [table])
