"""Engine tab: state badge + boot phase, profile cards, Start / Switch / Stop, preflight checklist with
per-item overrides, the equivalent `docker run`, the last diagnosis, and a filterable log tail.

Thin: every action calls `state.engine` (EngineController). Start/Switch/Stop return at once with a
ticket; the badge, phase and diagnosis are redrawn when the page feed says what the tab shows of them changed
(docs/engine.md, "Who listens"); the log tail comes on the page feed as text (app/ui/logtail.py, issue 49).
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

import gradio as gr

from app.backend import oplog
from app.backend.engine.controller import EngineController
from app.backend.engine.logs.loglines import LogFilter, StreamChoice
from app.backend.engine.lifecycle.tickets import Ticket
from app.backend.engine.lifecycle.oplock import Holder
from app.backend.engine.lifecycle.preflight import PreflightReport
from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState, LIVE_STATES, count_text
from app.backend.profiles.registry import profile_label
from app.backend.recipe.command import render_shell
from app.backend.recipe.schema import ProfileSpec
from app.backend.state import AppState
from app.ui.logtail import STREAMS, LiveTail, TailStream, view_of
from app.ui.profile_html import profile_cards
from app.ui.shell import QUICK, Shell
from app.ui.theme import BAD, BUSY, GOOD, STATE_COLOURS
from app.ui import upgrade as upgrade_section
from app.ui.gpus import EVERY_GPU, gpu_choice, scope_gpus

TITLE = "Engine"
LOG_LINES = 300
MARK = {"pass": ("✔", GOOD), "warn": ("▲", BUSY), "fail": ("✖", BAD)}


def status_html(snap: EngineSnapshot, runtime: str, busy: str) -> str:
    color = STATE_COLOURS[snap.state]
    sim = ' <span class="moet-sim-tag">SIMULATED</span>' if snap.simulated else ""
    phase = ("" if snap.state is EngineState.READY or not snap.phase or snap.phase == snap.state.value
             else f" · {escape(snap.phase)}")
    pool = ""
    if snap.pool is not None and snap.pool.slots is not None:
        ps = snap.pool
        pool = f"FP4 pool: {ps.slots} slots" + (f" × {ps.slot_mib:g} MiB" if ps.slot_mib else "")
    rows = [
        f'<span data-testid="engine-state" data-state="{snap.state.value}"'
        f' data-profile="{escape(snap.profile_id or "")}" style="background:{color};color:#fff;'
        f'border-radius:999px;padding:2px 12px;font-weight:700">{snap.state.value.upper()}</span>{sim}'
        f' <b>{escape(snap.profile_id or "no profile")}</b>{phase}',
        escape(snap.message) if snap.message else "",
        pool,
        f"{escape(snap.container_name)} · {escape(snap.base_url)}" if snap.container_name else "",
        f"runtime: {escape(runtime)}",
        f"<i>{escape(busy)}</i>" if busy else "",
    ]
    return '<div id="engine-status-box" role="status" aria-live="polite">' + "<br>".join(r for r in rows if r) + "</div>"


def gpu_rows_html(rows: list[tuple[int, EngineSnapshot]], left_out: set[int]) -> str:
    """A box of several GPUs: one row per GPU's engine (docs/engine.md "Several GPUs"), with what it says and
    its last failure; "Apply to" above picks the GPU the buttons act on (`moet-panel engine … --gpu` too)."""
    cells = []
    for gpu, snap in rows:
        color = STATE_COLOURS[snap.state]
        note = " · left out of the gateway (measuring)" if gpu in left_out else ""
        said = snap.diagnosis.title if snap.diagnosis is not None and snap.state is EngineState.FAILED else snap.message
        cells.append(
            f'<tr data-testid="engine-gpu-row" data-gpu="{gpu}" data-state="{snap.state.value}"'
            f' data-profile="{escape(snap.profile_id or "")}">'
            f"<td>GPU {gpu}</td><td><span style=\"color:{color};font-weight:700\">{snap.state.value}</span></td>"
            f"<td>{escape(snap.profile_id or '-')}{' · build ' + escape(snap.build) if snap.build else ''}</td>"
            f"<td>{escape(snap.base_url or '-')}{note}</td><td>{escape(said[:160])}</td></tr>")
    return ('<table id="engine-gpus"><tr><th>GPU</th><th>state</th><th>profile</th><th>listens</th><th>says</th></tr>'
            + "".join(cells) + "</table>")


def controls(snap: EngineSnapshot, selected: str | None = None, busy: Ticket | None = None) -> tuple[bool, bool]:
    """(Start can act, Switch can act): no Start over a live engine, no Switch with nothing to switch from,
    nor to the profile already serving (issue 29); neither while this panel's start, stop or switch runs (issue
    49: a switch's stopping phase made Start clickable)."""
    if busy is not None and busy.action in CHANGING:
        return False, False
    return (snap.state not in LIVE_STATES,
            snap.state is not EngineState.STOPPED and not (selected and selected == snap.profile_id))


def selector_after(last_live: str | None, live: str | None, pid: str | None) -> tuple[bool, str | None]:
    """When the Engine tab's view moved: (move the selector to `live`, the profile the buttons act for). It moves
    only when what serves moved from what this page last drew (`last_live`; None: a fresh page). An operation's end
    seen on returning to the tab, say, keeps a profile picked since (the journey's pick was undone under load, its
    Switch left disabled)."""
    if last_live is not None and live == last_live and pid:
        return False, pid
    return True, live


CHANGING = frozenset({"start", "stop", "switch"})  # this panel's operations that change what serves


def shown_profile(snap: EngineSnapshot, busy: Ticket | None) -> str | None:
    """The profile the selector shows: a start's or switch's target while it runs (issue 49: during a switch the
    selector snapped back to the profile being stopped), else the one serving (None: leave the pick alone)."""
    if busy is not None and busy.action in ("start", "switch") and busy.profile_id:
        return busy.profile_id
    return snap.profile_id if snap.profile_id and snap.state is not EngineState.STOPPED else None


def view_key(snap: EngineSnapshot, busy: Ticket | None = None) -> str:
    """What, when it changes, resets the selector and the action line (docs/engine.md, 'The UI follows')."""
    op = f"{busy.action}:{busy.profile_id or ''}" if busy is not None and busy.action in CHANGING else ""
    return f"{snap.state.value}|{snap.profile_id or ''}|{snap.container_id}|{op}"


def diagnosis_html(d: Diagnosis | None) -> str:
    if d is None:
        return '<p class="moet-ok">No failure recorded.</p>'
    evidence = "".join(f"<li><code>{escape(e[:300])}</code></li>" for e in d.evidence)
    return (f'<div data-testid="engine-diagnosis" data-reason="{escape(d.reason)}">'
            f"<p><b>{escape(d.title)}</b></p><p>{escape(d.explanation)}</p>"
            f"<p><b>Fix:</b> {escape(d.fix)}</p>" + (f"<ul>{evidence}</ul>" if evidence else "") + "</div>")


def preflight_html(report: PreflightReport) -> str:
    rows = []
    for i in report.items:
        mark, color = MARK[i.status]
        over = " (overridden)" if i.status == "fail" and i.id in report.overrides else ""
        fix = f"<br><small>fix: {escape(i.fix)}</small>" if i.fix and i.status != "pass" else ""
        rows.append(f'<tr data-item="{escape(i.id)}" data-status="{i.status}"><td style="color:{color}">{mark} '
                    f"{i.status}{over}</td><td><b>{escape(i.title)}</b><br><small>{escape(i.detail)}</small>{fix}</td></tr>")
    return (f'<div class="moet-study"><table><caption>Preflight: {escape(report.summary())}</caption>'
            + "".join(rows) + "</table></div>")


def _choices(profiles: list[ProfileSpec]) -> list[tuple[str, str]]:
    out = []
    for p in profiles:
        fig = f" — {p.decode.shown} tok/s, {p.quality_label}" if p.measured and p.decode else " — not measured"
        out.append((profile_label(p) + fig, p.id))
    return out


def _command(ctl: EngineController, profile_id: str) -> str:
    try:
        return render_shell(ctl.run_spec(profile_id))
    except (KeyError, ValueError) as exc:
        return f"# cannot build the command: {exc}"


def _cards(state: AppState, ctl: EngineController, profile_id: str) -> str:
    return profile_cards(state.settings.recipe, ctl.profiles(), profile_id, {})


def _logs(ctl: EngineController, stream: StreamChoice, needle: str | None) -> str:
    return LiveTail.of(ctl).text(LogFilter(stream, needle or ""), LOG_LINES)


def render(state: AppState, shell: Shell) -> None:
    ctl = state.engine
    if ctl is None:
        gr.Markdown("Engine control is not available: this panel runs without an engine controller.")
        return
    snap = ctl.snapshot()
    initial = snap.profile_id or state.settings.recipe.recommended_profile.id
    status = gr.HTML(status_html(snap, ctl.describe_runtime(), ""), elem_id="engine-status")
    box = state.box
    multi = box is not None and len(box.gpus) > 1
    if box is not None and multi:  # one row per GPU; a one-GPU box shows the tab as before
        def _gpu_rows() -> str:
            return gpu_rows_html([(r.gpu, r.snapshot) for r in box.rows()], box.left_out())

        gpus_box = gr.HTML(_gpu_rows(), elem_id="engine-gpus-box")
        # redrawn with the badge and the header, in the same event when a GPU's engine changed (issue 49: the
        # table lagged the header by seconds on its own timer)
        # as shown, with what resets the buttons: not the whole snapshot (the canary's result moves it, issue 49)
        shell.version(lambda: (_gpu_rows(), [view_key(r.snapshot) for r in box.rows()]))
        shell.on_tick(_gpu_rows, None, [gpus_box])
        gr.Markdown(f"The badge above, the diagnosis and the log below are GPU {box.gpus[0]}'s engine; the table "
                    "shows every GPU's. `moet-panel engine logs --gpu N` prints another GPU's log.")
    # what Start/Switch/Stop act on: one GPU's engine, or every GPU's (a switch then rolls one GPU at a time)
    gpus = box.gpus if box is not None else [0]

    def _controls(snap: EngineSnapshot, selected: str | None = None, busy: Ticket | None = None) -> tuple[bool, bool]:
        # several GPUs: the buttons act on the GPU chosen in "Apply to", whose state GPU 0's badge does not show;
        # each engine's controller refuses what cannot be done, with why (a row per GPU shows the states)
        # while an operation runs on the GPUs "Apply to" names, neither Start nor Switch (issue 49)
        if multi:
            return (False, False) if busy is not None and busy.action in CHANGING else (True, True)
        return controls(snap, selected, busy)

    scope = gr.Radio([*map(gpu_choice, gpus), EVERY_GPU], value=gpu_choice(gpus[0]), label="Apply to",
                     elem_id="engine-scope", visible=multi)
    with gr.Row():
        profile = gr.Radio(_choices(state.profiles.list()), value=initial, label="Profile", elem_id="engine-profile")
    # the pick as the server last heard it (gr.State lives on the server: a redraw reads it as it is when it runs, not
    # the selector's value its request carried — under load that was a pick the user had already changed)
    picked = gr.State(initial)
    can_start, can_switch = _controls(snap, initial)
    with gr.Row():
        start_btn = gr.Button("Start", variant="primary", elem_id="engine-start", interactive=can_start)
        switch_btn = gr.Button("Switch to selected profile", elem_id="engine-switch", interactive=can_switch)
        stop_btn = gr.Button("Stop", variant="stop", elem_id="engine-stop")
        # while a stop/switch drains the answers in flight (docs/engine.md "Keeps serving"): end the wait now
        now_btn = gr.Button("Switch now", variant="stop", elem_id="engine-drain-now", visible=snap.draining)
        pre_btn = gr.Button("Run preflight", elem_id="engine-preflight-run")
    action = gr.Markdown("", elem_id="engine-action")
    with gr.Accordion("Profile cards (the card's figures)", open=False):
        cards = gr.HTML(_cards(state, ctl, initial), elem_id="engine-cards")
    with gr.Accordion("Preflight checklist", open=False, elem_id="engine-preflight-box") as pre_box:
        checklist = gr.HTML("<p>Run preflight to check Docker, GPU, ECC, memory, disk, artifacts, the ckpt pin, "
                            "the image and the port.</p>", elem_id="engine-preflight")
        overrides = gr.CheckboxGroup([], label="Start anyway despite these failing items (explicit override)",
                                     elem_id="engine-overrides", visible=False)  # shown only with failing items
    with gr.Accordion("Equivalent command (what the panel runs)", open=False):
        command = gr.Code(_command(ctl, initial), language="shell", elem_id="engine-command")
    upgrade_section.render(state, shell, scope)  # builds, evidence, promote / roll back (docs/engine.md "Upgrading")
    gr.Markdown("**Last diagnosis**")
    diag = gr.HTML(diagnosis_html(snap.diagnosis), elem_id="engine-diagnosis-box")
    with gr.Accordion("Engine log (live tail)", open=True):
        with gr.Row():
            needle = gr.Textbox(label="Filter", placeholder="e.g. delta tier, ERROR, planes", elem_id="engine-log-filter")
            stream = gr.Radio(STREAMS, value="both", label="Stream", elem_id="engine-log-stream")
            download = gr.DownloadButton("Download log", elem_id="engine-log-download")
        logbox = gr.Textbox(_logs(ctl, "both", ""), lines=14, max_lines=14, label="Log", interactive=False,
                            autoscroll=True, elem_id="engine-log", elem_classes=["moet-code"])

    def _target(where: str) -> tuple[list[int], bool]:
        """(the GPUs the buttons act on, whether that is every GPU); a one-GPU box: GPU 0's engine, as before."""
        if box is None or not multi:
            return [gpus[0]], False
        chosen = scope_gpus(where, box.gpus)
        return (box.gpus, True) if chosen is None else (chosen, False)

    def _ctl_of(g: int) -> EngineController:
        return box.controller(g) if box is not None and multi else ctl

    def _busy_in(where: str | None) -> Ticket | None:
        """The start/stop/switch running on the GPUs "Apply to" names (a one-GPU box: the engine's)."""
        if not multi:
            return ctl.busy()
        for g in _target(where or "")[0]:
            t = _ctl_of(g).busy()
            if t is not None and t.action in CHANGING:
                return t
        return None

    def _start(pid: str, over: list[str], where: str, request: gr.Request) -> str:
        targets, _ = _target(where)
        if box is not None and multi:
            return " · ".join(f"GPU {g}: {_ticket_text(t)}"
                              for g, t in box.start(pid, targets, tuple(over or ()), who=_who(request)))
        return _ticket_text(ctl.start(pid, tuple(over or ()), who=_who(request)))

    def _switch(pid: str, over: list[str], where: str, request: gr.Request) -> str:
        targets, every = _target(where)
        if box is not None and every:
            return box.start_rolling_switch(pid, box.gpus, who=_who(request))
        g = targets[0]
        text = _ticket_text(_ctl_of(g).switch(pid, tuple(over or ()), who=_who(request)))
        return f"GPU {g}: {text}" if multi else text

    def _stop(where: str, request: gr.Request) -> str:
        targets, _ = _target(where)
        if box is not None and multi:
            return " · ".join(f"GPU {g}: {_ticket_text(t)}" for g, t in box.stop(targets, who=_who(request)))
        return _ticket_text(ctl.stop(who=_who(request)))

    def _now() -> str:
        ctl.switch_now()
        return "✔ not waiting for the answers any more: stopping now"

    def _preflight(pid: str, over: list[str]) -> tuple[str, Any, Any]:
        report = ctl.preflight(pid, frozenset(over or ()))
        failing = [i.id for i in report.items if i.status == "fail"]
        # Open the checklist: a result hidden in a closed accordion looks like nothing happened.
        return (preflight_html(report), gr.CheckboxGroup(choices=failing, value=[o for o in over or [] if o in failing],
                                                         visible=bool(failing)),
                gr.Accordion(open=True))

    def _select(pid: str, where: str | None = None) -> tuple[str, str, Any, str]:
        return (_cards(state, ctl, pid), _command(ctl, pid),
                gr.Button(interactive=_controls(ctl.snapshot(), pid, _busy_in(where))[1]), pid)

    def _lists(pid: str | None, where: str | None = None) -> tuple[Any, ...]:
        """The profile list as it is now (a custom profile saved since the page was built), the serving
        profile selected while one serves, the buttons for that pick."""
        snap, busy = ctl.snapshot(), _busy_in(where)
        ids = state.profiles.ids()
        live = shown_profile(snap, busy)
        live = live if live in ids else None
        pick = live or (pid if pid in ids else state.settings.recipe.recommended_profile.id)
        choices = _choices(state.profiles.list())
        if pick == pid:  # no value, nor buttons: sent back always, they could undo a pick made meanwhile
            return gr.Radio(choices=choices), gr.skip(), gr.skip(), gr.skip()
        can_start, can_switch = _controls(snap, pick, busy)
        return (gr.Radio(choices=choices, value=pick), gr.Button(interactive=can_start),
                gr.Button(interactive=can_switch), pick)

    shell.on_load(_lists, [profile, scope], [profile, start_btn, switch_btn, picked])
    shell.on_tab(TITLE, _lists, [profile, scope], [profile, start_btn, switch_btn, picked])

    start_btn.click(_start, [profile, overrides, scope], [action], api_name="engine_start", **QUICK)
    switch_btn.click(_switch, [profile, overrides, scope], [action], api_name="engine_switch", **QUICK)
    stop_btn.click(_stop, [scope], [action], api_name="engine_stop", **QUICK)
    now_btn.click(_now, None, [action], api_name="engine_switch_now", **QUICK)
    pre_btn.click(_preflight, [profile, overrides], [checklist, overrides, pre_box], api_name="engine_preflight")
    profile.change(_select, [profile, scope], [cards, command, switch_btn, picked], **QUICK)
    download.click(lambda s, n: str(ctl.export_logs(LogFilter(s, n or ""))), [stream, needle], [download], **QUICK)

    seen = gr.State(None)  # per browser tab: (the view_key last drawn, the profile it showed); None after a reload
    # per browser tab, what its status box and its log tail show (None after a reload: draw). The engine part is
    # the seq of the last change event drawn; the busy line and the runtime are no engine events (this panel's
    # own operation, another process's lock), so they are compared as shown.
    status_drawn = gr.State(None)

    def _tick(last: tuple[str, str | None] | None, drawn: Any, pid: str | None,
              where: str | None = None) -> tuple[Any, ...]:
        seq, snap = shell.engine_now()
        busy = ctl.busy()
        busy_text = " · ".join(t for t in (busy_line(busy, ctl.lock_holder()), drain_line(snap)) if t)
        shown = (seq, busy_text, ctl.describe_runtime())
        if drawn is not None and tuple(drawn) == shown:
            status_out, diag_out, now_out = gr.skip(), gr.skip(), gr.skip()
        else:
            status_out = status_html(snap, shown[2], busy_text)
            diag_out = diagnosis_html(snap.diagnosis) if drawn is None or drawn[0] != seq else gr.skip()
            # the drain's button names what waits (issue 49: a Stop's drain read "Switch now")
            now_out = gr.Button(visible=snap.draining,
                                value="Stop now" if busy is not None and busy.action == "stop" else "Switch now")
        head = (status_out, diag_out, now_out)
        tail = (shown,)
        busy = _busy_in(where) if multi else busy  # the buttons follow the GPUs "Apply to" names
        key = view_key(snap, busy)
        last_key, last_live = last or ("", None)
        if key == last_key:
            return (*head, gr.skip(), gr.skip(), gr.skip(), gr.skip(), last, *tail, gr.skip())
        # The truth moved (or the page was reloaded): the selector shows what serves (or what a start/switch under
        # way will serve), stale action lines go, buttons that cannot act are disabled.
        live = shown_profile(snap, busy)
        move, pick = selector_after(last_live if last_key else None, live, pid)
        radio = gr.Radio(value=live) if move and live else gr.skip()
        can_start, can_switch = _controls(snap, pick, busy)
        action_out = gr.skip() if busy is not None and busy.action in CHANGING else ""  # its own line stays
        return (*head, radio, action_out, gr.Button(interactive=can_start), gr.Button(interactive=can_switch),
                (key, live), *tail, live if move and live else gr.skip())

    def _shows() -> object:
        """What this tab shows of the engine, as shown (the page feed's version): not the change event's seq, which
        moves on changes it does not show (issue 49: the canary's result every 30 s sent a Gradio event). The
        drain's countdown moves every second while it lasts: part of the status (docs/engine.md)."""
        snap, busy = shell.engine_now()[1], ctl.busy()
        busy_text = " · ".join(t for t in (busy_line(busy, ctl.lock_holder()), drain_line(snap)) if t)
        return (status_html(snap, ctl.describe_runtime(), busy_text), snap.diagnosis, view_key(snap, busy),
                snap.draining, busy.action if busy is not None else None)

    shell.version(_shows)
    shell.on_tick(_tick, [seen, status_drawn, picked, scope],
                  [status, diag, now_btn, profile, action, start_btn, switch_btn, seen, status_drawn, picked])
    # the live log tail: drawn by the page feed (text in the box, no Gradio event, issue 49); a new filter or
    # stream answers at once below, and the page opens a stream for that view (assets/js/page-feed.js)
    shell.stream(lambda query: TailStream(LiveTail.of(ctl), "engine-log", view_of(query), LOG_LINES))
    needle.submit(lambda s, n: _logs(ctl, s, n), [stream, needle], [logbox], **QUICK)
    stream.change(lambda s, n: _logs(ctl, s, n), [stream, needle], [logbox], **QUICK)


def busy_line(busy: Ticket | None, holder: Holder | None) -> str:
    """The Engine tab's line under the badge: this panel's own operation, or who else is changing the engine.
    An "adopt" only follows a boot someone else started, so the lock holder (when known) is named instead."""
    watching = busy is not None and busy.action == "adopt"
    if holder is not None and (busy is None or watching):
        return f"the engine is being changed by {holder.describe()}"
    if busy is None:
        return ""
    if watching:
        return f"following a start of {busy.profile_id or 'the engine'} made outside this panel…"
    return f"{busy.action} {busy.profile_id or ''} in progress…"


def drain_line(snap: EngineSnapshot) -> str:
    """While a stop/switch drains: how many answers it waits for and for how long at most."""
    if not snap.draining:
        return ""
    left = max(0, round(snap.drain_deadline - time.time()))
    return f"waiting for {count_text(snap.drain_in_flight, 'answer')} to finish (up to {left} s)"


def _who(request: gr.Request | None) -> str:
    return oplog.user(getattr(request, "username", None))


def _ticket_text(t: Ticket) -> str:
    return ("✔ " if t.accepted else "✖ ") + escape(t.message)
