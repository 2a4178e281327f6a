"""Fleet tab (a fleet's front only: its state dir holds a fleet file, docs/fleet.md): per box its state, tokens per
second, the profile each engine runs, VRAM, pool coverage, the router's health of it, slots and answers in flight.

Thin: the figures are the backend's (`state.front.view()`, refreshed on a thread every 2 s; tok/s is the rate of
each box's token counter, app/backend/fleet/boxes.py). The table is drawn by the page feed itself (`Shell.live`,
docs/ui-and-safety.md "The page feed"): no Gradio event at all, its HTML sent only to a page showing this tab and
only when a figure as shown moved, patched in place. No timer of its own."""

from __future__ import annotations

import html

import gradio as gr

from app.backend.fleet.service import BoxView, FleetView
from app.backend.state import AppState
from app.ui.shell import Shell

TITLE = "Fleet"
LIVE_ID = "fleet-live"  # the element the page feed draws (Shell.live)
COLUMNS = ("box", "state", "tok/s", "profile per GPU", "VRAM used", "pool coverage", "router", "slots", "in flight")


def shown(state: AppState) -> bool:
    """Only a fleet's front has this tab: one box alone shows exactly the tabs it had."""
    return state.front is not None


def _num(v: float | None, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


def tok_s(v: float | None) -> str:
    """Rounded as shown (the page is redrawn only when this text moves): whole tokens, tenths below 10."""
    return "—" if v is None else format(v, ".1f" if v < 10 else ".0f")


def _state(v: BoxView) -> tuple[str, str, str]:
    """(the state in a word or two, why (smaller, under it), a class for its colour)."""
    b = v.box
    if b.serving:
        return "serving", "", "ok"
    if b.draining:
        return "draining", "", "warn"
    if not b.reachable:
        return "down", b.error, "bad"
    return ("refused", b.error, "bad") if b.error else (b.state or "not serving", "", "warn")


def _td(label: str, cls: str, inner: str) -> str:
    """A cell named by its column (`data-label`: its name on a narrow window's card; `data-col`: for tests)."""
    col = label.lower().replace(" ", "-").replace("/", "-")
    klass = f" class='{cls}'" if cls else ""
    return f"<td data-label='{label}' data-col='{col}'{klass}>{inner}</td>"


def _row(v: BoxView) -> str:
    b, fig = v.box, v.figures
    words, why, kind = _state(v)
    router = {True: "healthy", False: "unhealthy", None: "not listed"}[v.router_healthy]
    vram = (f"{_num(fig.vram_used_gib, '.1f')} / {_num(fig.vram_total_gib, '.1f')} GiB"
            if fig.vram_used_gib is not None else "—")
    cov = f"{fig.pool_coverage:.0%}" if fig.pool_coverage is not None else "—"
    # a box that does not answer: its /metrics' failure says nothing more than its state
    profiles = ", ".join(fig.profiles) or (fig.error if fig.error and b.reachable else "—")
    sim = " <span class='moet-sim-tag'>SIMULATED</span>" if fig.simulated else ""
    cells = [("box", "", f"<strong>{html.escape(b.name)}</strong>{sim}"),
             ("state", f"moet-fleet-{kind}",
              html.escape(words) + (f"<small class='moet-fleet-why'>{html.escape(why)}</small>" if why else "")),
             ("tok/s", "num", tok_s(v.tokens_per_s))]
    cells += [(c, cls, html.escape(str(x))) for c, cls, x in (
        ("profile per GPU", "", profiles), ("VRAM used", "", vram), ("pool coverage", "num", cov),
        ("router", "", router), ("slots", "num", b.slots if b.reachable else "—"),
        ("in flight", "num", b.in_flight if b.reachable else "—"))]
    tds = "".join(_td(c, cls, x) for c, cls, x in cells)
    return f"<tr data-box='{html.escape(b.name, quote=True)}'>{tds}</tr>"


def fleet_html(view: FleetView) -> str:
    router = f"router pid {view.router_pid}" if view.router_pid else "router not running (the panel restarts it)"
    head = (f"<p id='fleet-router'>{html.escape(router)}; started {view.router_starts} time(s)</p>")
    if not view.asked:
        return "<p id='fleet-empty'>Asking the boxes and the router…</p>"
    if not view.boxes:
        return head + "<p id='fleet-empty'>No boxes yet: <code>moet-panel fleet add NAME URL</code>.</p>"
    cols = "".join(f"<th scope='col'>{c}</th>" for c in COLUMNS)
    rows = "".join(_row(v) for v in view.boxes)
    # a card per box on a narrow window, each figure under its column's name (panel.css, moet-stack)
    return (f"{head}<table class='moet-fleet moet-stack' id='fleet-boxes'>"
            f"<thead><tr>{cols}</tr></thead><tbody>{rows}</tbody></table>"
            "<p class='moet-fleet-note'>tok/s: the tokens each box's gateway generated for the front, a rate over "
            "its last ~10 s of /metrics (an answer counts when it ends); — while not known.</p>")


def render(state: AppState, shell: Shell) -> None:
    front = state.front
    assert front is not None
    gr.Markdown("The boxes behind this front: clients use this panel's gateway; vLLM's router spreads their "
                "requests over the boxes that serve (docs/fleet.md). `moet-panel fleet add|remove` changes them.")
    gr.HTML(shell.live(LIVE_ID, lambda: fleet_html(front.view())), elem_id="fleet-table")
