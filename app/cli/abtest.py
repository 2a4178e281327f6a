"""`moet-panel abtest`: your own blind A/B of two profiles (docs/selftest.md, "Blind A/B").

  abtest run --a quality --b balanced (--prompts FILE.jsonl | --from-chat CONV[:N,...] ...) --seeds 42,43
             [--chat-context] [--rubric TEXT] [--max-tokens N]
  abtest chat-prompts          list the chat history's conversations and user turns (for --from-chat)
             [--gpus A,B [--every-gpu]]   a box of several GPUs: A on GPU A's engine and B on GPU B's, at
             once, no switch (--every-gpu: agreed that no GPU serves meanwhile); each GPU switches back after
  abtest resume RUN_ID [--gpus A,B]   continue after a cancel or a panel restart (the journal keeps answers)
  abtest grade RUN_ID [--scores]   blind grading in the terminal: l / r / t per pair, or 0–10 per side
  abtest rubric RUN_ID TEXT    set the rubric shown beside every pair (journalled)
  abtest reveal RUN_ID [--json]
  abtest list
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.cli.main import add_common, settings_from


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("abtest", help="blind A/B of two profiles on your own prompts (journalled, resumable)")
    add_common(p)
    sub = p.add_subparsers(dest="ab_cmd", metavar="ACTION", required=True)
    r = sub.add_parser("run", help="generate every prompt x seed on A, switch, then on B")
    r.add_argument("--a", required=True, dest="profile_a", help="profile A (e.g. quality)")
    r.add_argument("--b", required=True, dest="profile_b", help="profile B (e.g. balanced); a side may name an "
                   "engine build: PROFILE@BUILD (e.g. quality@next; `moet-panel engine builds`)")
    r.add_argument("--prompts", metavar="FILE", help='JSONL: one {"prompt": "..."} per line')
    r.add_argument("--from-chat", action="append", default=[], metavar="CONV[:N,...]",
                   help="user turns from the chat history: a conversation id (or a unique prefix) = all its user "
                        "turns, CONV:2,4 = its 2nd and 4th; repeatable; `abtest chat-prompts` lists them")
    r.add_argument("--chat-context", action="store_true",
                   help="send each chat turn after its conversation's system prompt and earlier turns")
    r.add_argument("--rubric", default="", help="what a 10 and a 0 mean (shown beside every pair when grading)")
    r.add_argument("--seeds", default="42,43,44", help="comma-separated seeds (default 42,43,44)")
    r.add_argument("--max-tokens", type=int, default=8192, help="per answer; answers are never clipped after")
    gpus_help = ("a box of several GPUs (docs/engine.md \"Several GPUs\"): A on the first GPU's engine and B on "
                 "the second's, both at once, with no switch between A and B")
    every_help = ("--gpus naming every GPU of the box leaves none serving (the gateway refuses every request until "
                  "the run ends): refused unless this is given")
    r.add_argument("--gpus", metavar="A,B", help=gpus_help)
    r.add_argument("--every-gpu", action="store_true", help=every_help)
    for name, helptext in (("resume", "continue a run"), ("grade", "grade a run blind"), ("reveal", "show the result"),
                           ("rubric", "set the rubric shown beside every pair")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("run_id")
        if name == "resume":
            q.add_argument("--gpus", metavar="A,B", help=gpus_help)
            q.add_argument("--every-gpu", action="store_true", help=every_help)
        if name == "grade":
            q.add_argument("--scores", action="store_true", help="score each side 0–10 instead of picking")
        if name == "rubric":
            q.add_argument("text")
    sub.add_parser("list", help="list A/B runs")
    sub.add_parser("chat-prompts", help="list the chat history's user turns (selectors for --from-chat)")
    for action in sub.choices.values():  # `abtest list -h` lists the common options too
        add_common(action)
    p.set_defaults(func=run)


def _services(settings: Any, gpus: str | None = None, every_gpu: bool = False) -> tuple[Any, Any]:
    """(something to close, the A/B service). `gpus` "A,B": one engine per GPU, A's side on GPU A, B's on GPU B;
    naming every GPU of the box needs `every_gpu` (none would serve meanwhile, issue 49)."""
    from app.backend.abtest.runner import ABRunService, every_gpu_message
    from app.backend.state import make_engine_controller, make_box_gpus
    from app.backend.engine.gpus import parse_gpus
    from app.backend.engine.lifecycle.tickets import ControllerOptions
    from app.backend.telemetry.gpu import box_gpu_count, follow_engine, make_gpu_reader

    reader = make_gpu_reader(settings)
    if gpus is None:
        ctl = make_engine_controller(settings, reader)
        follow_engine(reader, ctl)
        return ctl, ABRunService(settings, ctl)
    box = make_box_gpus(settings, reader, box_gpu_count(reader), lambda gpu: ControllerOptions(actor="CLI"))
    for g in box.gpus:
        follow_engine(reader, box.controller(g), g)
    try:
        chosen = parse_gpus(gpus, box.gpus, "--gpus")
        if len(chosen) != 2:
            raise ValueError(f"--gpus {gpus!r}: name two different GPUs, A's then B's (this box has "
                             f"{', '.join(map(str, box.gpus))})")
        if set(box.gpus) <= set(chosen) and not every_gpu:
            raise ValueError(every_gpu_message((chosen[0], chosen[1])))
    except ValueError:
        box.close()
        raise
    a, b = box.controller(chosen[0]), box.controller(chosen[1])
    return box, ABRunService(settings, a, engine_for=lambda side: a if side == "A" else b)


def _follow(svc: Any) -> int:
    from app.backend.jobs import JobState

    last = ""
    try:
        while (p := svc.wait(0.5)).state is JobState.RUNNING:
            if p.step != last:
                last = p.step
                eta = f", about {p.eta_s / 60:.1f} min left" if p.eta_s else ""
                print(f"  {p.done}/{p.total}{eta}  {p.step}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        svc.cancel()
        p = svc.wait(60)
    print(f"{p.state.value}: {p.message} (run {p.run_id})", file=sys.stderr)
    return 0 if p.state is JobState.DONE else (130 if p.state is JobState.CANCELLED else 1)


def _chat_history(settings: Any) -> Any:
    """The panel's chat history opened read-only: safe beside a running panel."""
    from app.backend.abtest.chat_prompts import history_of_store
    from app.backend.chat.conversations import DB_NAME
    from app.backend.chat.store import ChatStore, ChatStoreError

    try:
        return history_of_store(ChatStore(settings.state_dir / DB_NAME, read_only=True))
    except ChatStoreError as exc:
        raise ValueError(str(exc)) from exc


def _prompts(args: argparse.Namespace, settings: Any) -> list[Any]:
    from app.backend.abtest.chat_prompts import pick_turns
    from app.backend.abtest.journal import parse_prompts_jsonl

    if not args.prompts and not args.from_chat:
        raise ValueError("give --prompts FILE.jsonl and/or --from-chat CONV[:N,...] (abtest chat-prompts lists them)")
    out: list[Any] = []
    if args.prompts:
        out += parse_prompts_jsonl(Path(args.prompts).read_text(encoding="utf-8"))
    if args.from_chat:
        out += [t.to_prompt(args.chat_context) for t in pick_turns(_chat_history(settings), args.from_chat)]
    return out


def _ask_score(side: str) -> float | None:
    while True:
        raw = input(f"score {side} 0–10 (q = quit)? ").strip().lower()
        if raw.startswith("q"):
            return None
        try:
            v = float(raw)
        except ValueError:
            continue
        if 0 <= v <= 10:
            return v


def _grade(journal: Any, st: Any, scores: bool) -> int:
    from app.backend.abtest.grading import blind_pairs, grade_from_pick, grade_from_scores

    if st.rubric:
        print(f"rubric: {st.rubric}")
    for bp in [b for b in blind_pairs(st) if not b.graded]:
        print(f"\n=== pair {bp.index + 1} (prompt {bp.prompt_id}, seed {bp.seed}) ===\n{bp.prompt}\n"
              f"\n--- LEFT ---\n{bp.left}\n\n--- RIGHT ---\n{bp.right}\n")
        if scores:
            left = _ask_score("LEFT")
            right = _ask_score("RIGHT") if left is not None else None
            if left is None or right is None:
                break
            journal.append(st.spec.run_id, grade_from_scores(st, bp.prompt_id, bp.seed, left, right))
            continue
        ans = ""
        while ans not in ("l", "r", "t", "q"):
            ans = input("better: l(eft) / r(ight) / t(ie) / q(uit)? ").strip().lower()[:1]
        if ans == "q":
            break
        pick = {"l": "left", "r": "right", "t": "tie"}[ans]
        journal.append(st.spec.run_id, grade_from_pick(st, bp.prompt_id, bp.seed, pick))
    return 0


def run(args: argparse.Namespace) -> int:
    from app.backend.abtest.grading import reveal, reveal_json, reveal_markdown
    from app.backend.abtest.journal import Journal, new_spec

    settings = settings_from(args)
    journal = Journal(settings.ensure_state_dir())
    try:
        if args.ab_cmd == "list":
            rows = []
            for rid in journal.runs():
                st = journal.load(rid)
                rows.append({"run_id": rid, "a": st.spec.profile_a, "b": st.spec.profile_b, "answers": st.generated,
                             "total": st.total, "graded": len(st.grades), "pairs": len(st.spec.cells)})
                if args.json:
                    continue
                print(f"{rid}  A={st.spec.profile_a} B={st.spec.profile_b}  {st.generated}/{st.total} answers, "
                      f"{len(st.grades)}/{len(st.spec.cells)} graded")
            if args.json:
                print(json.dumps(rows, indent=1))
            elif not rows:
                print(f"no A/B runs in {settings.data_dir} yet (start one: moet-panel abtest run ...)", file=sys.stderr)
            return 0
        if args.ab_cmd == "chat-prompts":
            history = _chat_history(settings)
            for conv in history.conversations():
                print(f"{conv.id}  {conv.title}")
                for t in history.turns(conv.id):
                    print(f"  --from-chat {conv.id[:8]}:{t.turn}   {t.short(60)}")
            return 0
        if args.ab_cmd in ("run", "resume"):
            if args.ab_cmd == "run":
                seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
                spec = new_spec(args.profile_a, args.profile_b, _prompts(args, settings), seeds, args.max_tokens,
                                rubric=args.rubric)
            ctl, svc = _services(settings, args.gpus, args.every_gpu)
            try:
                p = svc.start(spec) if args.ab_cmd == "run" else svc.resume(args.run_id)
                print(f"A/B run {p.run_id}: {p.total} answers; Ctrl-C stops (resume continues)", file=sys.stderr)
                return _follow(svc)
            finally:
                ctl.close()
        if args.ab_cmd == "rubric":
            journal.set_rubric(args.run_id, args.text)
            return 0
        st = journal.load(args.run_id)
        if args.ab_cmd == "grade":
            return _grade(journal, st, args.scores)
        rv = reveal(st)
        print(reveal_json(rv) if args.json else reveal_markdown(rv))
        return 0
    except (ValueError, OSError, KeyError) as exc:
        print(f"moet-panel: {exc.args[0] if isinstance(exc, KeyError) and exc.args else exc}", file=sys.stderr)
        return 2
