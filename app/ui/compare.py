"""Compare tab: your own blind A/B of two profiles (docs/selftest.md, "Blind A/B").

Thin: runs, journal and grading live in `state.abtest` (ABRunService) and app.backend.abtest; this tab
shows pairs with the sides shuffled and the profile names hidden until the reveal.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import gradio as gr

from app.backend.abtest.grading import blind_pairs, grade_from_pick, reveal, reveal_markdown
from app.backend.abtest.journal import new_spec, parse_pasted, parse_prompts_jsonl
from app.backend.selftest.runner import JobState
from app.backend.state import AppState

TITLE = "Compare"


def _runs(state: AppState) -> list[str]:
    return state.abtest.journal.runs()


def progress_html(state: AppState, run_id: str | None) -> str:
    p = state.abtest.progress()
    if p.state is JobState.RUNNING:
        pct = int(100 * p.done / max(1, p.total))
        eta = f" · about {p.eta_s / 60:.1f} min left" if p.eta_s else ""
        return (f'<div id="ab-progress" data-state="running"><progress max="100" value="{pct}"></progress> '
                f"{p.done}/{p.total} answers{eta} · {html.escape(p.step)}</div>")
    if not run_id:
        return '<div id="ab-progress" data-state="idle">No run selected.</div>'
    try:
        st = state.abtest.journal.load(run_id)
    except (KeyError, ValueError) as exc:
        return f'<div id="ab-progress" data-state="invalid" role="alert">{html.escape(str(exc))}</div>'
    msg = f" · {html.escape(p.message)}" if p.run_id == run_id and p.message else ""
    return (f'<div id="ab-progress" data-state="{p.state.value if p.run_id == run_id else "idle"}">run {run_id}: '
            f"{st.generated}/{st.total} answers, {len(st.grades)}/{len(st.spec.cells)} pairs graded{msg}</div>")


def pair_view(state: AppState, run_id: str | None) -> tuple[str, str, str, str]:
    """(heading, prompt, left, right) of the first ungraded pair."""
    if not run_id:
        return "", "", "", ""
    try:
        st = state.abtest.journal.load(run_id)
    except (KeyError, ValueError):
        return "", "", "", ""
    pairs = blind_pairs(st)
    todo = [b for b in pairs if not b.graded]
    if not todo:
        done = "All pairs graded: reveal below." if pairs else "No pair has both answers yet."
        return f'<div id="ab-pair-head" data-left="0">{done}</div>', "", "", ""
    b = todo[0]
    head = (f'<div id="ab-pair-head" data-left="{len(todo)}" data-prompt="{b.prompt_id}" data-seed="{b.seed}">'
            f"Pair {b.index + 1} of {len(pairs)} · {len(todo)} to grade · seed {b.seed} — which answer is better?</div>")
    return head, b.prompt, b.left, b.right


def render(state: AppState, shell: Any) -> None:
    if state.abtest is None or state.engine is None:
        gr.Markdown("The A/B comparison is not available in this build.")
        return
    gr.Markdown("Is the faster profile's quality cost visible on **your** work? Give prompts and seeds; the panel "
                "answers each prompt × seed on A, switches the engine, answers them on B, then shows you the pairs "
                "**blind** (sides shuffled, names hidden). The card: only extra seeds add real information.")
    ids = [p.id for p in state.engine.profiles()]
    with gr.Row():
        pa = gr.Dropdown(ids, value=ids[0], label="Profile A", elem_id="ab-a")
        pb = gr.Dropdown(ids, value=ids[1] if len(ids) > 1 else ids[0], label="Profile B", elem_id="ab-b")
        seeds = gr.Textbox("42,43", label="Seeds", elem_id="ab-seeds")
        max_tokens = gr.Number(8192, label="Max tokens per answer", precision=0, minimum=16, elem_id="ab-max")
    with gr.Row():
        pasted = gr.Textbox(lines=4, label="Prompts (separate with a line holding only ---)", elem_id="ab-prompts")
        upload = gr.File(label="or import JSONL ({\"prompt\": ...} per line)", file_types=[".jsonl"], elem_id="ab-jsonl")
    runs = _runs(state)
    with gr.Row():
        start = gr.Button("Start A/B run", variant="primary", elem_id="ab-start")
        cancel = gr.Button("Cancel", elem_id="ab-cancel")
        run_sel = gr.Dropdown(runs, value=runs[0] if runs else None, label="Run", elem_id="ab-run", allow_custom_value=False)
        resume = gr.Button("Resume run", elem_id="ab-resume")
    status = gr.HTML(progress_html(state, runs[0] if runs else None), elem_id="ab-status")
    gr.Markdown("### Blind grading")
    v = pair_view(state, runs[0] if runs else None)
    head = gr.HTML(v[0], elem_id="ab-head")
    prompt = gr.Textbox(v[1], label="Prompt", interactive=False, lines=2, elem_id="ab-prompt")
    with gr.Row():
        left = gr.Textbox(v[2], label="Left", interactive=False, lines=12, max_lines=30, elem_id="ab-left")
        right = gr.Textbox(v[3], label="Right", interactive=False, lines=12, max_lines=30, elem_id="ab-right")
    note = gr.Textbox(label="Rubric note (optional)", elem_id="ab-note")
    with gr.Row():
        b_left = gr.Button("Left is better", elem_id="ab-pick-left")
        b_tie = gr.Button("Tie", elem_id="ab-pick-tie")
        b_right = gr.Button("Right is better", elem_id="ab-pick-right")
    with gr.Row():
        show = gr.Button("Reveal", variant="primary", elem_id="ab-reveal-btn")
        dl = gr.DownloadButton("Export reveal (Markdown)", elem_id="ab-export")
    revealed = gr.Markdown("", elem_id="ab-reveal")
    quick: dict[str, Any] = {"show_progress": "hidden", "concurrency_limit": None}
    view_out = [status, head, prompt, left, right]

    def views(rid: str | None):
        return (progress_html(state, rid), *pair_view(state, rid))

    def begin(a: str, b: str, text: str, file: str | None, sd: str, mt: float):
        try:
            prompts = parse_pasted(text)
            if file:
                prompts += parse_prompts_jsonl(Path(file).read_text(encoding="utf-8"))
            seed_list = [int(s) for s in (sd or "").replace(" ", "").split(",") if s]
            spec = new_spec(a, b, prompts, seed_list, int(mt or 0))
            state.abtest.start(spec)
        except ValueError as exc:
            msg = f'<div id="ab-progress" data-state="invalid" role="alert">{html.escape(str(exc))}</div>'
            return gr.skip(), msg, gr.skip(), gr.skip(), gr.skip(), gr.skip()
        return gr.Dropdown(choices=_runs(state), value=spec.run_id), *views(spec.run_id)

    def do_resume(rid: str | None):
        try:
            if rid:
                state.abtest.resume(rid)
        except (ValueError, KeyError) as exc:
            return f'<div id="ab-progress" data-state="invalid" role="alert">{html.escape(str(exc))}</div>'
        return progress_html(state, rid)

    def pick(which: str, rid: str | None, text: str):
        if rid:
            st = state.abtest.journal.load(rid)
            todo = [b for b in blind_pairs(st) if not b.graded]
            if todo:
                g = grade_from_pick(st, todo[0].prompt_id, todo[0].seed, which, text or "")
                state.abtest.journal.append(rid, g)
        return (*views(rid), "")

    def do_reveal(rid: str | None):
        if not rid:
            return "Pick a run first.", None
        try:
            md = reveal_markdown(reveal(state.abtest.journal.load(rid)))
        except ValueError as exc:
            return f"**{exc}**", None
        out = Path(state.settings.state_dir) / "exports"
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"abtest-{rid}.md"
        path.write_text(md, encoding="utf-8")
        return md, str(path)

    start.click(begin, [pa, pb, pasted, upload, seeds, max_tokens], [run_sel, *view_out], **quick)
    cancel.click(lambda rid: (state.abtest.cancel(), progress_html(state, rid))[1], [run_sel], [status], **quick)
    resume.click(do_resume, [run_sel], [status], **quick)
    run_sel.change(lambda rid: (*views(rid), ""), [run_sel], [*view_out, revealed], **quick)
    for btn, which in ((b_left, "left"), (b_tie, "tie"), (b_right, "right")):
        btn.click(lambda rid, text, w=which: pick(w, rid, text), [run_sel, note], [*view_out, note], **quick)
    show.click(do_reveal, [run_sel], [revealed, dl], **quick)
    seen = gr.State(JobState.IDLE.value)

    def tick(rid: str | None, last: str):
        now = state.abtest.progress().state
        if now is JobState.RUNNING:
            return progress_html(state, rid), gr.skip(), gr.skip(), gr.skip(), gr.skip(), now.value
        if last == JobState.RUNNING.value:  # just finished: the pairs are ready to grade
            return (*views(rid), now.value)
        return gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), now.value

    shell.timer.tick(tick, [run_sel, seen], [*view_out, seen], show_progress="hidden", concurrency_limit=None,
                     trigger_mode="once")
