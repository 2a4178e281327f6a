"""Compare tab: your own blind A/B of two profiles (docs/selftest.md, "Blind A/B").

Thin: runs, journal and grading live in `state.abtest` (ABRunService) and app.backend.abtest; this tab
shows pairs with the sides shuffled and the profile names hidden until the reveal. Prompts come from
the paste box, a JSONL file, or user turns picked from the chat history (`state.chat`).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import gradio as gr

from app.backend import oplog
from app.backend.abtest.chat_prompts import ChatHistory, history_of_service, pick_turns
from app.backend.abtest.grading import (
    blind_pairs,
    grade_from_pick,
    grade_from_scores,
    reveal,
    reveal_json,
    reveal_markdown,
)
from app.backend.abtest.journal import Prompt, new_spec, parse_pasted, parse_prompts_jsonl
from app.backend.engine.builds.store import side_choices
from app.backend.abtest.runner import ABRunService, every_gpu_message
from app.backend.web.exports import write_export
from app.backend.jobs import JobState
from app.backend.state import AppState
from app.ui.shell import QUICK, Shell

TITLE = "Compare"
MODE_PICK = "Pick: left / right / tie"
MODE_SCORE = "Score each side 0–10"


def _runs(svc: ABRunService) -> list[str]:
    return svc.journal.runs()


def _kept_run(rid: str | None, runs: list[str]) -> str | None:
    """The selected run while it still exists, else the newest."""
    return rid if rid in runs else (runs[0] if runs else None)


def _invalid(msg: str) -> str:
    return f'<div id="ab-progress" data-state="invalid" role="alert">{html.escape(msg)}</div>'


def progress_html(svc: ABRunService, run_id: str | None) -> str:
    p = svc.progress()
    if p.state is JobState.RUNNING:
        pct = int(100 * p.done / max(1, p.total))
        eta = f" · about {p.eta_s / 60:.1f} min left" if p.eta_s else ""
        return (f'<div id="ab-progress" data-state="running"><progress max="100" value="{pct}"></progress> '
                f"{p.done}/{p.total} answers{eta} · {html.escape(p.step)}</div>")
    if not run_id:
        return '<div id="ab-progress" data-state="idle">No run selected.</div>'
    try:
        st = svc.journal.load(run_id)
    except (KeyError, ValueError) as exc:
        return _invalid(str(exc))
    msg = f" · {html.escape(p.message)}" if p.run_id == run_id and p.message else ""
    return (f'<div id="ab-progress" data-state="{p.state.value if p.run_id == run_id else "idle"}">run {run_id}: '
            f"{st.generated}/{st.total} answers, {len(st.grades)}/{len(st.spec.cells)} pairs graded{msg}</div>")


def pair_view(svc: ABRunService, run_id: str | None) -> tuple[str, str, str, str, str]:
    """(heading, prompt, left, right, rubric) of the first ungraded pair."""
    if not run_id:
        return "", "", "", "", ""
    try:
        st = svc.journal.load(run_id)
    except (KeyError, ValueError):
        return "", "", "", "", ""
    pairs = blind_pairs(st)
    todo = [b for b in pairs if not b.graded]
    if not todo:
        done = "All pairs graded: reveal below." if pairs else "No pair has both answers yet."
        return f'<div id="ab-pair-head" data-left="0">{done}</div>', "", "", "", st.rubric
    b = todo[0]
    ctx = f" · sent after {b.context} earlier message{'s' if b.context != 1 else ''} of its chat" if b.context else ""
    head = (f'<div id="ab-pair-head" data-left="{len(todo)}" data-prompt="{b.prompt_id}" data-seed="{b.seed}">'
            f"Pair {b.index + 1} of {len(pairs)} · {len(todo)} to grade · seed {b.seed}{ctx} — which answer is better?</div>")
    return head, b.prompt, b.left, b.right, st.rubric


def chat_choices(history: ChatHistory | None) -> list[tuple[str, str]]:
    if history is None:
        return []
    return [(f"{c.title} · {c.message_count} messages", c.id) for c in history.conversations()]


def turn_choices(history: ChatHistory | None, conv_ids: list[str] | None) -> list[tuple[str, str]]:
    if history is None:
        return []
    return [(t.label(), t.key) for cid in conv_ids or [] for t in history.turns(cid)]


def _keep(value: list[str] | None, choices: list[tuple[str, str]]) -> list[str]:
    known = {v for _, v in choices}
    return [v for v in value or [] if v in known]


def default_gpus(names: list[str]) -> tuple[str | None, str | None]:
    """("A runs on", "B runs on") that leave GPU 0 serving: the last two GPUs; on two, both on the last."""
    if not names:
        return None, None
    return (names[-2] if len(names) > 2 else names[-1]), names[-1]


def _gpu_pair(svc: ABRunService, a_on: str | None, b_on: str | None) -> tuple[int, int] | None:
    if not svc.gpus:
        return None
    by_name = {f"GPU {g}": g for g in svc.gpus}
    return by_name.get(a_on or "", svc.gpus[-1]), by_name.get(b_on or "", svc.gpus[-1])


def every_gpu_warning(svc: ABRunService, a_on: str | None, b_on: str | None) -> str:
    """The warning shown while the choices would leave no GPU serving ("" otherwise)."""
    pair = _gpu_pair(svc, a_on, b_on)
    if pair is None or not svc.takes_every_gpu(pair):
        return '<div id="ab-gpu-note" data-every="0"></div>'
    return (f'<div id="ab-gpu-note" data-every="1" role="alert" class="moet-warn">⚠ '
            f"{html.escape(every_gpu_message(pair))}</div>")


def render(state: AppState, shell: Shell) -> None:
    if state.abtest is None or state.engine is None:
        gr.Markdown("The A/B comparison is not available in this build.")
        return
    svc = state.abtest
    history = history_of_service(state.chat) if state.chat is not None else None
    gr.Markdown("Is the faster profile's quality cost visible on **your** work? Give prompts and seeds; the panel "
                "answers each prompt × seed on A, switches the engine, answers them on B, switches back to the "
                "profile it served before, then shows you the pairs **blind** (sides shuffled, names hidden). The "
                "card: only extra seeds add real information."
                + (" On this box of several GPUs A and B can run **side by side** on two GPUs, at once and with no "
                   "switch; the other GPUs keep serving. By default one GPU keeps serving." if svc.gpus else ""))
    ids = side_choices(state.settings, state.profiles.ids())  # PROFILE@BUILD sides too (docs/engine.md "Upgrading")
    with gr.Row():
        pa = gr.Dropdown(ids, value=ids[0], label="Profile A", elem_id="ab-a")
        pb = gr.Dropdown(ids, value=ids[1] if len(ids) > 1 else ids[0], label="Profile B", elem_id="ab-b")
        seeds = gr.Textbox("42,43", label="Seeds", elem_id="ab-seeds")
        max_tokens = gr.Number(8192, label="Max tokens per answer (16 or more)", precision=0, elem_id="ab-max")
    # a box of several GPUs (docs/engine.md "Several GPUs"): A and B side by side on two GPUs, at once and with no
    # switch between them (the same GPU twice: A then B on it); those GPUs are left out of the gateway meanwhile
    # and the others keep serving. Hidden on a one-GPU box.
    # By default one GPU keeps serving (issue 49: A and B on both GPUs of a two-GPU box took it out of service):
    # the last two GPUs, or on a two-GPU box both sides taking turns on GPU 1 (GPU 0, which Chat talks to,
    # serves). A run on every GPU is refused until the tick-box below says so.
    gpu_names = [f"GPU {g}" for g in svc.gpus]
    a0, b0 = default_gpus(gpu_names)
    with gr.Row(visible=bool(gpu_names)):
        ga = gr.Dropdown(gpu_names, value=a0, label="A runs on", elem_id="ab-gpu-a")
        gb = gr.Dropdown(gpu_names, value=b0, label="B runs on", elem_id="ab-gpu-b")
        every = gr.Checkbox(False, label="Take every GPU out of service for the run (the gateway refuses requests "
                            "until it ends)", elem_id="ab-every-gpu")
    gpu_warn = gr.HTML(every_gpu_warning(svc, a0, b0), elem_id="ab-gpu-warning")
    with gr.Row():
        pasted = gr.Textbox(lines=4, label="Prompts (separate with a line holding only ---)", elem_id="ab-prompts")
        upload = gr.File(label="or import JSONL ({\"prompt\": ...} per line)", file_types=[".jsonl"], elem_id="ab-jsonl")
    with gr.Accordion("Prompts from chat history", open=False, elem_id="ab-chat-box"):
        convs0 = chat_choices(history)
        with gr.Row():
            chat_convs = gr.Dropdown(convs0, value=[], multiselect=True, label="Conversations", elem_id="ab-chat-convs",
                                     scale=4)
            chat_refresh = gr.Button("Refresh list", elem_id="ab-chat-refresh", scale=1, min_width=120)
        chat_turns = gr.CheckboxGroup([], value=[], label="Their user turns: tick the ones to use as prompts",
                                      elem_id="ab-chat-turns")
        chat_ctx = gr.Checkbox(True, label="Send each turn after its conversation so far (system prompt and earlier "
                               "turns, the same on A and B); off = the turn alone", elem_id="ab-chat-context")
    runs = _runs(svc)
    with gr.Row():
        start = gr.Button("Start A/B run", variant="primary", elem_id="ab-start")
        cancel = gr.Button("Cancel", elem_id="ab-cancel")
        run_sel = gr.Dropdown(runs, value=runs[0] if runs else None, label="Run", elem_id="ab-run", allow_custom_value=False)
        resume = gr.Button("Resume run", elem_id="ab-resume")
    status = gr.HTML(progress_html(svc, runs[0] if runs else None), elem_id="ab-status")
    gr.Markdown("### Blind grading")
    v = pair_view(svc, runs[0] if runs else None)
    head = gr.HTML(v[0], elem_id="ab-head")
    prompt = gr.Textbox(v[1], label="Prompt", interactive=False, lines=2, elem_id="ab-prompt")
    with gr.Row(equal_height=False):
        left = gr.Textbox(v[2], label="Left", interactive=False, lines=12, max_lines=30, elem_id="ab-left", scale=2,
                          min_width=260)
        right = gr.Textbox(v[3], label="Right", interactive=False, lines=12, max_lines=30, elem_id="ab-right", scale=2,
                           min_width=260)
        with gr.Column(scale=1, min_width=220):
            rubric = gr.Textbox(v[4], label="Rubric (optional, for the whole run)", lines=6, elem_id="ab-rubric",
                                placeholder="e.g. 10 = correct, complete, compiles; 5 = right idea, bugs; 0 = wrong")
            rubric_save = gr.Button("Save rubric", size="sm", elem_id="ab-rubric-save")
    mode = gr.Radio([MODE_PICK, MODE_SCORE], value=MODE_PICK, label="Grade by", elem_id="ab-mode")
    note = gr.Textbox(label="Note on this pair (optional)", elem_id="ab-note")
    with gr.Row(visible=True) as pick_row:
        b_left = gr.Button("Left is better", elem_id="ab-pick-left")
        b_tie = gr.Button("Tie", elem_id="ab-pick-tie")
        b_right = gr.Button("Right is better", elem_id="ab-pick-right")
    with gr.Row(visible=False) as score_row:
        s_left = gr.Slider(0, 10, value=5, step=0.5, label="Left score", elem_id="ab-score-left")
        s_right = gr.Slider(0, 10, value=5, step=0.5, label="Right score", elem_id="ab-score-right")
        s_save = gr.Button("Save scores", variant="primary", elem_id="ab-score-save")
    with gr.Row():
        show = gr.Button("Reveal", variant="primary", elem_id="ab-reveal-btn")
        dl = gr.DownloadButton("Export reveal (Markdown)", elem_id="ab-export")
        dl_json = gr.DownloadButton("Export reveal (JSON)", elem_id="ab-export-json")
    revealed = gr.Markdown("", elem_id="ab-reveal")
    view_out = [status, head, prompt, left, right, rubric]
    # after a grade: the next pair, the note cleared and the sliders back to the middle (no anchoring on
    # the last pair's scores); the rubric box is left as typed
    grade_out = [status, head, prompt, left, right, note, s_left, s_right]

    def views(rid: str | None) -> tuple[str, str, str, str, str, str]:
        return (progress_html(svc, rid), *pair_view(svc, rid))

    def refresh_convs(selected: list[str] | None) -> Any:
        choices = chat_choices(history)
        return gr.Dropdown(choices=choices, value=_keep(selected, choices))

    def show_turns(conv_ids: list[str] | None, ticked: list[str] | None) -> Any:
        choices = turn_choices(history, conv_ids)
        return gr.CheckboxGroup(choices=choices, value=_keep(ticked, choices))

    def on_gpus(a_on: str | None, b_on: str | None) -> tuple[int, int] | None:
        """(A's GPU, B's GPU) from the "runs on" choices; None on a one-GPU box (the one engine, switching)."""
        return _gpu_pair(svc, a_on, b_on)

    def begin(a: str, b: str, text: str, file: str | None, sd: str, mt: float, keys: list[str] | None,
              with_ctx: bool, a_on: str | None, b_on: str | None, all_gpus: bool,
              request: gr.Request) -> tuple[Any, ...]:
        try:
            prompts: list[str | Prompt] = list(parse_pasted(text))
            if file:
                prompts += parse_prompts_jsonl(Path(file).read_text(encoding="utf-8"))
            if keys and history is not None:
                prompts += [t.to_prompt(bool(with_ctx)) for t in pick_turns(history, list(keys))]
            seed_list = [int(s) for s in (sd or "").replace(" ", "").split(",") if s]
            spec = new_spec(a, b, prompts, seed_list, int(mt or 0))
            svc.start(spec, who=oplog.user(getattr(request, "username", None)), gpus=on_gpus(a_on, b_on),
                      every_gpu=bool(all_gpus))
        except ValueError as exc:
            return gr.skip(), _invalid(str(exc)), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        return gr.Dropdown(choices=_runs(svc), value=spec.run_id), *views(spec.run_id)

    def do_resume(rid: str | None, a_on: str | None, b_on: str | None, all_gpus: bool, request: gr.Request) -> str:
        try:
            if rid:
                svc.resume(rid, who=oplog.user(getattr(request, "username", None)), gpus=on_gpus(a_on, b_on),
                           every_gpu=bool(all_gpus))
        except (ValueError, KeyError) as exc:
            return _invalid(str(exc))
        return progress_html(svc, rid)

    def first_todo(rid: str | None) -> tuple[Any, Any] | None:
        if not rid:
            return None
        st = svc.journal.load(rid)
        todo = [b for b in blind_pairs(st) if not b.graded]
        return (st, todo[0]) if todo else None

    def next_pair(rid: str | None) -> tuple[Any, ...]:
        return (progress_html(svc, rid), *pair_view(svc, rid)[:4], "", 5, 5)

    def pick(which: str, rid: str | None, text: str) -> tuple[Any, ...]:
        if (found := first_todo(rid)) is not None and rid:
            st, bp = found
            svc.journal.append(rid, grade_from_pick(st, bp.prompt_id, bp.seed, which, text or ""))
        return next_pair(rid)

    def score(rid: str | None, lv: float, rv: float, text: str) -> tuple[Any, ...]:
        if (found := first_todo(rid)) is not None and rid:
            st, bp = found
            try:
                g = grade_from_scores(st, bp.prompt_id, bp.seed, float(lv), float(rv), text or "")
            except ValueError as exc:
                return (_invalid(str(exc)), *(gr.skip() for _ in range(7)))
            svc.journal.append(rid, g)
        return next_pair(rid)

    def save_rubric(rid: str | None, text: str) -> str:
        if not rid:
            return _invalid("pick a run first: the rubric belongs to a run")
        svc.journal.set_rubric(rid, text or "")
        return progress_html(svc, rid)

    def do_reveal(rid: str | None) -> tuple[str, str | None, str | None]:
        if not rid:
            return "Pick a run first.", None, None
        try:
            r = reveal(svc.journal.load(rid))
        except ValueError as exc:
            return f"**{exc}**", None, None
        md = reveal_markdown(r)
        path_md = write_export(state.settings.state_dir, f"abtest-{rid}.md", md)
        path_json = write_export(state.settings.state_dir, f"abtest-{rid}.json", reveal_json(r))
        return md, str(path_md), str(path_json)

    def set_mode(m: str) -> tuple[Any, Any]:
        return gr.Row(visible=m == MODE_PICK), gr.Row(visible=m == MODE_SCORE)

    chat_refresh.click(refresh_convs, [chat_convs], [chat_convs], **QUICK)
    chat_convs.change(show_turns, [chat_convs, chat_turns], [chat_turns], **QUICK)

    def profile_pick(current: str | None, fallback: int) -> Any:
        now = side_choices(state.settings, state.profiles.ids())
        if current in now:  # no value: sent back always, it could undo a pick made meanwhile
            return gr.Dropdown(choices=now)
        return gr.Dropdown(choices=now, value=now[min(fallback, len(now) - 1)])

    def lists(a: str | None, b: str | None, rid: str | None, selected: list[str] | None) -> tuple[Any, ...]:
        """Everything the page lists, as the backend has it now: profiles (a custom one saved since),
        runs (one started from another tab or the CLI, or before a reload), chat conversations. A changed
        run selection redraws its pair (run_sel.change)."""
        runs_now = _runs(svc)
        keep = _kept_run(rid, runs_now)
        runs_dd = gr.Dropdown(choices=runs_now) if keep == rid else gr.Dropdown(choices=runs_now, value=keep)
        return profile_pick(a, 0), profile_pick(b, 1), runs_dd, refresh_convs(selected)

    def on_load(a: str | None, b: str | None, rid: str | None, selected: list[str] | None) -> tuple[Any, ...]:
        # the pair as it is now, too: the page may have been built long ago
        return (*lists(a, b, rid, selected), *views(_kept_run(rid, _runs(svc))))

    refresh_in = [pa, pb, run_sel, chat_convs]
    shell.on_load(on_load, refresh_in, [pa, pb, run_sel, chat_convs, *view_out])
    shell.on_tab(TITLE, lists, refresh_in, [pa, pb, run_sel, chat_convs])
    start.click(begin, [pa, pb, pasted, upload, seeds, max_tokens, chat_turns, chat_ctx, ga, gb, every],
                [run_sel, *view_out], **QUICK)
    for pick_gpu in (ga, gb):
        pick_gpu.change(lambda x, y: every_gpu_warning(svc, x, y), [ga, gb], [gpu_warn], **QUICK)
    def do_cancel(rid: str | None) -> str:
        svc.cancel()
        return progress_html(svc, rid)

    cancel.click(do_cancel, [run_sel], [status], **QUICK)
    resume.click(do_resume, [run_sel, ga, gb, every], [status], **QUICK)
    run_sel.change(lambda rid: (*views(rid), ""), [run_sel], [*view_out, revealed], **QUICK)
    for btn, which in ((b_left, "left"), (b_tie, "tie"), (b_right, "right")):
        btn.click(lambda rid, text, w=which: pick(w, rid, text), [run_sel, note], grade_out, **QUICK)
    s_save.click(score, [run_sel, s_left, s_right, note], grade_out, **QUICK)
    rubric_save.click(save_rubric, [run_sel, rubric], [status], **QUICK)
    mode.change(set_mode, [mode], [pick_row, score_row], **QUICK)
    show.click(do_reveal, [run_sel], [revealed, dl, dl_json], **QUICK)
    seen = gr.State(JobState.IDLE.value)

    def tick(rid: str | None, last: str) -> tuple[Any, ...]:
        now = svc.progress().state
        # Start and Resume answer "already running" while a run goes: disabled then, enabled when it ends
        # (sent when the job state moved, as the page last drew it)
        can = now is not JobState.RUNNING
        buttons = (gr.Button(interactive=can), gr.Button(interactive=can)) if now.value != last else (gr.skip(),) * 2
        if now is JobState.RUNNING:
            return progress_html(svc, rid), *(gr.skip() for _ in range(5)), now.value, *buttons
        if last == JobState.RUNNING.value:  # just finished: the pairs are ready to grade
            return (*views(rid), now.value, *buttons)
        return (*(gr.skip() for _ in range(6)), now.value, *buttons)

    shell.version(svc.progress)
    shell.on_tick(tick, [run_sel, seen], [*view_out, seen, start, resume])
