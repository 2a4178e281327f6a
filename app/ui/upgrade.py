"""Engine tab section "Engine builds — upgrade with evidence" (docs/engine.md "Upgrading the engine").

Build a commit (demo: the SIMULATED `next`), serve the candidate, read current vs candidate side by side from
this box's runs, promote or roll back. Thin: every figure and action comes from app.backend.engine.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

import gradio as gr

from app.backend.contracts import count_text
from app.backend import oplog
from app.backend.engine.builds import store as builds
from app.backend.engine import upgrade
from app.backend.evidence import builds as evidence
from app.backend.engine.builds.job import BuildProgress, BuildService
from app.backend.jobs import JobState
from app.backend.state import AppState
from app.ui.gpus import scope_gpus
from app.ui.shell import QUICK, Shell

CELL = "padding:4px 10px;border-bottom:1px solid #8884;text-align:left"


def _e(x: Any) -> str:
    return escape(str(x))


def _n(v: float | None, fmt: str, unit: str = "") -> str:
    return "—" if v is None else fmt.format(v) + unit


def builds_html(views: list[builds.BuildView]) -> str:
    rows = "".join(
        f'<tr data-build="{_e(v.build.id)}" data-current="{int(v.current)}">'
        f'<td style="{CELL}">{"★ " if v.current else ""}<b>{_e(v.build.id)}</b></td>'
        f'<td style="{CELL}"><code>{_e(v.build.commit[:12])}</code></td><td style="{CELL}"><code>{_e(v.build.image)}</code></td>'
        f'<td style="{CELL}">{sum(e.kind in ("selftest", "abtest") for e in v.build.evidence)}</td>'
        f'<td style="{CELL}">{_n(v.build.size_bytes / 2**20 if v.build.size_bytes else None, "{:.0f}", " MiB")}</td>'
        f'<td style="{CELL}">{time.strftime("%Y-%m-%d %H:%M", time.localtime(v.build.built_at)) if v.build.built_at else "recipe pin"}'
        f'{" · SIMULATED" if v.build.simulated else ""}</td></tr>'
        for v in views)
    head = "".join(f'<th style="{CELL}">{h}</th>' for h in ("Build", "Commit", "Image", "Runs", "Size", "Built"))
    return f'<table id="engine-builds-table" style="border-collapse:collapse"><tr>{head}</tr>{rows}</table>'


def _vs_card(f: evidence.BuildFigures) -> str:
    if f.decode_tok_s is None:
        return "—"
    card = f" vs card {f.card_tok_s:g}" if f.card_tok_s else ""
    return f"{f.decode_tok_s:.1f} tok/s{card}"


def evidence_html(c: evidence.Comparison) -> str:
    """Current and candidate in two columns, one row per measure; the A/B below."""
    if c.candidate is None:
        return ('<div id="engine-evidence" data-candidate="">Only the current build exists: build a candidate above '
                "(a commit, or <code>next</code> in demo mode).</div>")
    cols = (c.current, c.candidate)

    def row(label: str, fn: Any) -> tuple[str, str, str]:
        return label, fn(cols[0]), fn(cols[1])

    rows = [
        row("Image", lambda f: f"<code>{_e(f.build.image)}</code>"),
        row("Decode", _vs_card),
        row("TTFT (decode runs)", lambda f: _n(f.ttft_s, "{:.3f}", " s")),
        row("Needles", lambda f: f.needles or "—"),
        row("VRAM at load (peak)", lambda f: _n(f.vram_gib, "{:.1f}", " GiB")),
        row("Boot time", lambda f: _n(f.boot_s, "{:.1f}", " s")),
        row("Pool coverage", lambda f: _n(f.coverage_pct, "{:.1f}", " %")),
        row("Self-test", lambda f: _e(f.selftest) or "none yet: run one on the Self-test tab"),
        row("Failures", lambda f: "<br>".join(_e(x) for x in f.failures) or "none"),
    ]
    head = (f'<tr><th style="{CELL}"></th><th style="{CELL}">Current: {_e(c.current.build.id)}'
            f'{" (SIMULATED)" if c.current.build.simulated else ""}</th>'
            f'<th style="{CELL}">Candidate: {_e(c.candidate.build.id)}{" (SIMULATED)" if c.candidate.build.simulated else ""}</th></tr>')
    body = "".join(f'<tr data-row="{_e(k)}"><td style="{CELL}"><b>{_e(k)}</b></td><td style="{CELL}">{a}</td>'
                   f'<td style="{CELL}">{b}</td></tr>' for k, a, b in rows)
    ab = c.ab
    ab_html = ("<p><b>Blind A/B</b>: none between these builds yet — on the Compare tab run "
               f"<code>quality</code> vs <code>quality@{_e(c.candidate.build.id)}</code>.</p>" if ab is None else
               f'<p data-ab-pairs="{ab.pairs}"><b>Blind A/B</b> {_e(ab.run_id)} (A = {_e(ab.a)}, B = {_e(ab.b)}): '
               f"{_e(ab.headline)} · {count_text(ab.pairs, 'graded pair')} of {ab.cells}</p>")
    return (f'<div id="engine-evidence" data-candidate="{_e(c.candidate.build.id)}">'
            f'<table style="border-collapse:collapse">{head}{body}</table>{ab_html}</div>')


def progress_html(p: BuildProgress) -> str:
    if p.state is JobState.IDLE:
        return '<span id="engine-build-progress" data-state="idle"></span>'
    return (f'<span id="engine-build-progress" data-state="{p.state.value}">{_e(p.state.value)} {_e(p.ref)}'
            f'{" · " + _e(p.step) if p.step else ""} · {_e(p.message)}<br><code style="font-size:11px">'
            f"{_e(p.last_line)}</code></span>")


def _candidates(reg: builds.BuildRegistry) -> list[str]:
    cur = reg.current_id()
    return [b.id for b in reg.all() if b.id != cur]


def render(state: AppState, shell: Shell, scope: Any = None) -> None:
    """`scope`: the Engine tab's "Apply to" (a box of several GPUs): the candidate serves where it says."""
    ctl = state.engine
    box = state.box
    if ctl is None:
        return
    settings = state.settings
    service = BuildService(settings)  # this page's builds (one at a time)
    reg = builds.registry(settings)
    with gr.Accordion("Engine builds — upgrade with evidence", open=False, elem_id="engine-builds"):
        table = gr.HTML(builds_html(reg.views()), elem_id="engine-builds-list")
        with gr.Row():
            ref = gr.Textbox(label="Build a commit", placeholder="a hash, tag or branch of the engine source "
                             "(demo mode: next)", elem_id="engine-build-ref", scale=3)
            build_btn = gr.Button("Build (low priority; the engine keeps serving)", elem_id="engine-build-run")
        progress = gr.HTML(progress_html(service.progress()), elem_id="engine-build-progress-box")
        cands = _candidates(reg)
        with gr.Row():
            # custom values allowed: a promote/rollback changes the choices while a tick may still send the old pick
            cand = gr.Dropdown(cands, value=cands[-1] if cands else None, label="Candidate", elem_id="engine-candidate",
                               allow_custom_value=True)
            serve_btn = gr.Button("Serve candidate (switch, with the drain)", elem_id="engine-serve-candidate",
                                  interactive=bool(cands))
            # the main action only when there is a candidate to promote (issue 49: styled as one with none)
            promote_btn = gr.Button("Promote candidate", variant="primary" if cands else "secondary",
                                    interactive=bool(cands), elem_id="engine-promote")
            rollback_btn = gr.Button("Roll back", variant="stop", elem_id="engine-rollback")
        result = gr.Markdown("", elem_id="engine-builds-action")
        ev = gr.HTML(evidence_html(evidence.compare(settings, cands[-1] if cands else None)), elem_id="engine-evidence-box")

    def _refresh(pick: str | None) -> tuple[Any, Any, Any, Any, Any]:
        now = _candidates(reg)
        pick = pick if pick in now else (now[-1] if now else None)
        return (builds_html(reg.views()), gr.Dropdown(choices=now, value=pick), evidence_html(evidence.compare(settings, pick)),
                gr.Button(interactive=bool(now)),
                gr.Button(variant="primary" if now else "secondary", interactive=bool(now)))

    def _build(text: str, request: gr.Request) -> str:
        return progress_html(service.start(text, None, oplog.user(getattr(request, "username", None))))

    def _serve(pick: str | None, where: str | None, request: gr.Request) -> str:
        if not pick:
            return "✖ no candidate: build one first"
        who = oplog.user(getattr(request, "username", None))
        multi = box is not None and len(box.gpus) > 1
        chosen: list[int] | list[None] | None = scope_gpus(where, box.gpus) if box is not None and multi else [None]
        if chosen is None:  # every GPU: one at a time, the others serving meanwhile
            assert box is not None
            profile = ctl.snapshot().profile_id or settings.recipe.recommended_profile.id
            return "✔ " + escape(box.start_rolling_switch(profile, box.gpus, who=who, build=pick))
        out = []
        for g in chosen:
            c = box.controller(g) if box is not None and g is not None else ctl
            snap = c.snapshot()
            profile = snap.profile_id or settings.recipe.recommended_profile.id
            op = c.switch if snap.state.value != "stopped" else c.start
            t = op(profile, who=who, build=pick)
            on = f"GPU {g}: " if g is not None else ""
            out.append(on + ("✔ " if t.accepted else "✖ ") + escape(f"{t.message} ({profile} on build {pick})"))
        return " · ".join(out)

    def _promote(pick: str | None, request: gr.Request) -> str:
        if not pick:
            return "✖ no candidate to promote"
        try:
            out = upgrade.promote(ctl, pick, oplog.user(getattr(request, "username", None)))
        except (ValueError, OSError) as exc:
            return "✖ " + escape(str(exc))
        return f"✔ current build: {escape(out.current)} (was {escape(out.previous)})" + (
            " — switching the engine to it (with the drain)" if out.ticket is not None else " — the next start runs it")

    def _rollback(request: gr.Request) -> str:
        try:
            out = upgrade.rollback(ctl, oplog.user(getattr(request, "username", None)))
        except (ValueError, OSError) as exc:
            return "✖ " + escape(str(exc))
        return f"✔ rolled back: current build {escape(out.current)} (undid {escape(out.previous)})" + (
            " — switching the engine to it (with the drain)" if out.ticket is not None else "")

    build_btn.click(_build, [ref], [progress], api_name="engine_build", **QUICK)
    serve_btn.click(_serve, [cand, scope] if scope is not None else [cand, gr.State(None)], [result],
                    api_name="engine_serve_candidate", **QUICK)
    listed = [table, cand, ev, serve_btn, promote_btn]
    promote_btn.click(_promote, [cand], [result], api_name="engine_promote", **QUICK).then(
        _refresh, [cand], listed)
    rollback_btn.click(_rollback, None, [result], api_name="engine_rollback", **QUICK).then(
        _refresh, [cand], listed)
    cand.change(lambda p: evidence_html(evidence.compare(settings, p)), [cand], [ev], **QUICK)
    shell.on_load(_refresh, [cand], listed)

    drawn = gr.State(None)  # per browser tab: the build progress last drawn

    def _tick(last: Any, pick: str | None) -> tuple[Any, ...]:
        p = service.progress()
        if p == last:
            return (*(gr.skip() for _ in range(1 + len(listed))), last)
        if p.state is JobState.DONE and (last is None or last.state is not JobState.DONE):
            return (progress_html(p), *_refresh(p.build or pick), p)  # a new build: list and evidence follow
        return (progress_html(p), *(gr.skip() for _ in listed), p)

    shell.on_tick(_tick, [drawn, cand], [progress, *listed, drawn])
    shell.version(service.progress)  # a build's progress moves the Engine tab's version (the page feed redraws it)
