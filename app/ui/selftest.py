"""Self-test tab: measure the serving profile on this box, beside the card's figures (docs/selftest.md).

Thin: everything comes from `state.selftest` (SelfTestService) and `state.engine.snapshot()`; the tab
never starts or switches the engine — it tells the user to, on the Engine tab.
"""

from __future__ import annotations

import html
from typing import Any

import gradio as gr

from app.backend import oplog
from app.backend.selftest.needle import parse_lengths
from app.backend.selftest.report import to_markdown
from app.backend.contracts import EngineState
from app.backend.jobs import JobState
from app.backend.selftest.runner import SelfTestService
from app.backend.selftest.store import export_file
from app.backend.selftest.types import SelfTestPlan
from app.backend.recipe.schema import ProfileSpec
from app.backend.state import AppState
from app.ui.shell import QUICK, Shell

TITLE = "Self-test"
# How long a run takes, chosen up front (issue 42): the card's method by default, a short check beside it. The
# status line under them says the estimate for what is set (SelfTestService.estimate_s).
PRESETS: dict[str, tuple[int, int, str]] = {
    "Full — the card's method (3 runs × 2,000 tokens, needles at 64k and 256k)": (3, 2000, "64k,256k"),
    "Quick check (1 run × 500 tokens, a needle at 64k)": (1, 500, "64k"),
}
FULL = next(iter(PRESETS))


def preset_values(name: str) -> tuple[int, int, str]:
    """(decode runs, tokens per run, needle lengths) of a preset; the full method for an unknown name."""
    return PRESETS.get(name, PRESETS[FULL])


def figures_html(svc: SelfTestService, profiles: list[ProfileSpec]) -> str:
    """One row per profile: the card's decode figure beside this box's latest self-test."""
    rows = []
    for p in profiles:
        st = svc.standing(p.id)
        card = f"{p.decode.value:g} tok/s" if p.decode is not None else "—"
        if st is None:
            box, note = "not measured yet", ""
        else:
            box = html.escape(st.line)
            note = html.escape(st.verdict) + (f' <b class="st-stale">— {html.escape(st.stale)}: run it again</b>'
                                              if st.stale else "")
        empty = "" if note else ' class="empty"'
        # data-label: a narrow window shows each row as a card, each cell under its column's name (panel.css)
        rows.append(f'<tr data-profile="{html.escape(p.id)}"><td data-label="profile">{p.number} · {html.escape(p.title)}</td>'
                    f'<td data-label="card decode">{card}</td><td data-label="this box">{box}</td>'
                    f'<td data-label="verdict"{empty}>{note}</td></tr>')
    return ('<table class="moet-table moet-stack" id="st-figures-table"><thead><tr><th>profile</th><th>card decode</th>'
            "<th>this box</th><th>verdict</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _plan(profile: str, runs: float, tokens: float, needles: str) -> SelfTestPlan:
    return SelfTestPlan(profile, runs=int(runs), decode_tokens=int(tokens),
                        needle_lengths=tuple(parse_lengths(needles or "")))


def gpu_of(svc: SelfTestService, where: str | None) -> int | None:
    """The GPU the "Measure on" choice names ("GPU 1"), None on a one-GPU box (the one engine)."""
    for g in svc.gpus:
        if where == f"GPU {g}":
            return g
    return svc.gpus[0] if svc.gpus else None


def status_html(svc: SelfTestService, profile: str, runs: float, tokens: float, needles: str,
                where: str | None = None) -> str:
    return run_status(svc, profile, runs, tokens, needles, where)[0]


def run_status(svc: SelfTestService, profile: str, runs: float, tokens: float, needles: str,
               where: str | None = None) -> tuple[str, bool]:
    """The line above Run, and whether Run can act now: it is disabled exactly while that line says why not
    (a run in progress, a plan that does not parse, an engine not serving this profile). `where`: the GPU to
    measure on a box of several ("GPU 1"); the other GPUs keep serving meanwhile."""
    p = svc.progress()
    if p.state is JobState.RUNNING:
        pct = int(p.fraction * 100)
        return (f'<div id="st-progress" data-state="running"><progress max="100" value="{pct}"></progress> '
                f"{pct}% · {html.escape(p.step)} · {p.elapsed_s:.0f} s of about {p.estimate_s:.0f} s</div>"), False
    try:
        est = svc.estimate_s(_plan(profile, runs, tokens, needles))
    except ValueError as exc:
        return f'<div id="st-progress" data-state="invalid" role="alert">{html.escape(str(exc))}</div>', False
    gpu = gpu_of(svc, where)
    why = svc.check(profile, gpu=gpu)
    last = f"<br>last run: {html.escape(p.message)}" if p.state is not JobState.IDLE and p.profile_id == profile else ""
    build = svc.engine_of(gpu).snapshot().build  # the build it measures (docs/engine.md "Upgrading the engine")
    on = f" on engine build {html.escape(build)}" if build else ""
    if svc.gpus:
        on += f" on GPU {gpu} (the gateway leaves it out meanwhile; the other GPUs keep serving)"
    ready = (f"ready to run{on}: about {est / 60:.1f} min" if not why else f"cannot run now: {html.escape(why)}")
    return f'<div id="st-progress" data-state="{p.state.value}">{ready}{last}</div>', not why


def status_out(svc: SelfTestService, profile: str, runs: float, tokens: float, needles: str,
               where: str | None = None) -> tuple[Any, Any, Any]:
    """(the line, the Run button, what the page now shows): every handler that redraws the line sends all three,
    so the timer's redraw (which skips what the page shows) never compares against a line another handler replaced."""
    line, can = run_status(svc, profile, runs, tokens, needles, where)
    return line, gr.Button(interactive=can), (line, can)


def result_md(svc: SelfTestService, profile: str) -> str:
    r = svc.store.latest(profile)
    return to_markdown(r) if r is not None else f"No self-test of profile `{profile}` yet."


def exports(svc: SelfTestService, profile: str) -> tuple[str | None, str | None]:
    """The latest result of a profile written as Markdown and JSON files (what the export buttons serve)."""
    r = svc.store.latest(profile)
    if r is None:
        return None, None
    state_dir = svc.settings.state_dir
    return str(export_file(state_dir, r, "md")), str(export_file(state_dir, r, "json"))


def render(state: AppState, shell: Shell) -> None:
    if state.selftest is None or state.engine is None:
        gr.Markdown("The self-test is not available in this build.")
        return
    svc, engine = state.selftest, state.engine
    gr.Markdown("Does **this box** reach the card's figures? The self-test streams long single-stream answers "
                "with the card's sampling (decode tok/s after the first token), times the first token at a few "
                "prompt lengths, and hides a code in 64K/256K prompts at depths 0.05/0.50/0.95 (counted in the "
                "engine's own tokens). It uses the engine as it runs: start the profile first on the Engine tab.")
    registry = state.profiles
    figures = gr.HTML(figures_html(svc, registry.list()), elem_id="st-figures")

    def default_profile(current: str | None = None) -> str:
        """The serving profile (what a self-test measures), else the one picked, else the first."""
        ids = registry.ids()
        serving = engine.snapshot().profile_id
        return serving if serving in ids else current if current in ids else ids[0]

    length = gr.Radio(list(PRESETS), value=FULL, label="How long", elem_id="st-length")
    with gr.Row():
        profile = gr.Dropdown(registry.choices(), value=default_profile(), label="Profile", elem_id="st-profile")
        # bounds checked by SelfTestPlan, said in the status line (Gradio's own printed a traceback, issue 49)
        runs = gr.Number(3, label="Decode runs (1–20)", precision=0, elem_id="st-runs")
        tokens = gr.Number(2000, label="Tokens per run (16–32768)", precision=0, elem_id="st-tokens")
        needles = gr.Textbox("64k,256k", label="Needle lengths", elem_id="st-needles")
    # a box of several GPUs (docs/engine.md "Several GPUs"): the GPU whose engine is measured; the gateway leaves
    # it out meanwhile and the others keep serving. Hidden on a one-GPU box.
    gpu_names = [f"GPU {g}" for g in svc.gpus]
    where = gr.Radio(gpu_names or ["GPU 0"], value=(gpu_names or ["GPU 0"])[0], label="Measure on",
                     elem_id="st-gpu", visible=bool(gpu_names))
    inputs = [profile, runs, tokens, needles, where]
    line0, can0 = run_status(svc, profile.value, 3, 2000, "64k,256k", where.value)
    status = gr.HTML(line0, elem_id="st-status")
    with gr.Row():
        run = gr.Button("Run self-test", variant="primary", elem_id="st-run", interactive=can0)
        cancel = gr.Button("Cancel", elem_id="st-cancel")
        md0, json0 = exports(svc, profile.value)
        dl_md = gr.DownloadButton("Export Markdown", md0, elem_id="st-export-md")
        dl_json = gr.DownloadButton("Export JSON", json0, elem_id="st-export-json")
    result = gr.Markdown(result_md(svc, profile.value), elem_id="st-result")
    shown = gr.State(None)  # per browser tab: (the line, Run can act) the page shows; None after a (re)load
    status_outs = [status, run, shown]

    def start(pid: str, n: float, t: float, nd: str, at: str, request: gr.Request) -> tuple[Any, ...]:
        try:
            svc.start(_plan(pid, n, t, nd), who=oplog.user(getattr(request, "username", None)), gpu=gpu_of(svc, at))
        except ValueError as exc:
            line = f'<div id="st-progress" data-state="invalid" role="alert">{html.escape(str(exc))}</div>'
            return line, gr.skip(), None
        return status_out(svc, pid, n, t, nd, at)

    run.click(start, inputs, status_outs, **QUICK)
    def do_cancel(pid: str, n: float, t: float, nd: str, at: str) -> tuple[Any, ...]:
        svc.cancel()
        return status_out(svc, pid, n, t, nd, at)

    cancel.click(do_cancel, inputs, status_outs, **QUICK)
    length.change(lambda name: preset_values(name), [length], [runs, tokens, needles], **QUICK)
    for ev in (runs.change, tokens.change, needles.change):
        ev(lambda *a: status_out(svc, *a), inputs, status_outs, **QUICK)

    def on_gpu(pid: str, n: float, t: float, nd: str, at: str) -> tuple[Any, ...]:
        """Another GPU chosen: the profile follows what that GPU's engine serves (a self-test measures the
        serving profile), then the line and the buttons for it."""
        serving = svc.engine_of(gpu_of(svc, at)).snapshot()
        pick = serving.profile_id if serving.is_ready and serving.profile_id in registry.ids() else pid
        return (gr.Dropdown(value=pick) if pick != pid else gr.skip(), *status_out(svc, pick, n, t, nd, at),
                result_md(svc, pick), *exports(svc, pick))

    where.change(on_gpu, inputs, [profile, *status_outs, result, dl_md, dl_json], **QUICK)
    profile.change(lambda *a: (*status_out(svc, *a), result_md(svc, a[0]), *exports(svc, a[0])), inputs,
                   [*status_outs, result, dl_md, dl_json], **QUICK)
    seen = gr.State(JobState.IDLE.value)  # per browser session: the job state its page last drew

    def on_load(pid: str | None, n: float, t: float, nd: str, at: str) -> tuple[Any, ...]:
        """A page opened (or reloaded) long after it was built: profiles saved since, the serving profile
        as the default, its latest result and exports."""
        pick = default_profile(pid)
        return (gr.Dropdown(choices=registry.choices(), value=pick), figures_html(svc, registry.list()),
                *status_out(svc, pick, n, t, nd, at), result_md(svc, pick), *exports(svc, pick))

    def on_tab(pid: str | None, at: str) -> tuple[Any, ...]:
        # opened again: the image or a profile may have changed meanwhile. A self-test measures the profile
        # that serves: while one serves, the tab opens on it (issue 42: it opened on the profile picked at page
        # load, "cannot run now: the engine serves balanced"); else the pick stays the user's. On a box of
        # several GPUs: what the GPU chosen under "Measure on" serves.
        snap = svc.engine_of(gpu_of(svc, at)).snapshot()
        if snap.state is EngineState.READY and snap.profile_id in registry.ids() and snap.profile_id != pid:
            return gr.Dropdown(choices=registry.choices(), value=snap.profile_id), figures_html(svc, registry.list())
        # a value only when the pick is gone: sent back always, it could undo a pick made meanwhile
        keep = pid in registry.ids()
        return (gr.Dropdown(choices=registry.choices()) if keep else
                gr.Dropdown(choices=registry.choices(), value=default_profile()), figures_html(svc, registry.list()))

    shell.on_load(on_load, inputs, [profile, figures, *status_outs, result, dl_md, dl_json])
    shell.on_tab(TITLE, on_tab, [profile, where], [profile, figures])

    def redraw_status(pid: str, n: float, t: float, nd: str, at: str, drawn: Any) -> tuple[Any, Any, Any]:
        """The line and the Run button as they are now (Run follows the engine becoming ready, or not), each
        sent only when it differs from what the page shows."""
        line, can = run_status(svc, pid, n, t, nd, at)
        old_line, old_can = tuple(drawn) if drawn is not None else (None, None)
        return (gr.skip() if line == old_line else line, gr.skip() if can == old_can else gr.Button(interactive=can),
                (line, can))

    def tick(pid: str, n: float, t: float, nd: str, at: str, last: str, drawn: Any) -> tuple[Any, ...]:
        p = svc.progress()
        now = p.state
        # a run started elsewhere (the Profiles card's "run it again", the CLI) for another profile: follow it
        follow = gr.Dropdown(value=p.profile_id) if now is JobState.RUNNING and p.profile_id != pid \
            and p.profile_id in registry.ids() else gr.skip()
        finished = last == JobState.RUNNING.value and now is not JobState.RUNNING
        line, button, drawn_now = redraw_status(pid, n, t, nd, at, drawn)
        if not finished:
            return line, button, drawn_now, follow, gr.skip(), gr.skip(), gr.skip(), gr.skip(), now.value
        return (line, button, drawn_now, follow, figures_html(svc, registry.list()), result_md(svc, pid),
                *exports(svc, pid), now.value)

    box = state.box
    # the line says whether the chosen GPU's engine serves the profile: every GPU's state is part of what it shows
    shell.version(lambda: (svc.progress(), shell.engine_now()[0],
                           tuple((r.snapshot.state, r.snapshot.profile_id, r.snapshot.build) for r in box.rows())
                           if box is not None and svc.gpus else ()))
    shell.on_tick(tick, inputs + [seen, shown], [*status_outs, profile, figures, result, dl_md, dl_json, seen])
