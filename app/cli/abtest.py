"""`moet-panel abtest`: your own blind A/B of two profiles (docs/selftest.md, "Blind A/B").

  abtest run --a quality --b balanced --prompts FILE.jsonl --seeds 42,43 [--max-tokens N]
  abtest resume RUN_ID         continue after a cancel or a panel restart (the journal keeps answers)
  abtest grade RUN_ID          blind grading in the terminal: l / r / t per pair (names hidden)
  abtest reveal RUN_ID [--json]
  abtest list
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from app.backend.settings import resolve_settings
from app.cli.main import add_common


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("abtest", help="blind A/B of two profiles on your own prompts (journalled, resumable)")
    add_common(p)
    sub = p.add_subparsers(dest="ab_cmd", metavar="ACTION", required=True)
    r = sub.add_parser("run", help="generate every prompt x seed on A, switch, then on B")
    r.add_argument("--a", required=True, dest="profile_a", help="profile A (e.g. quality)")
    r.add_argument("--b", required=True, dest="profile_b", help="profile B (e.g. balanced)")
    r.add_argument("--prompts", required=True, metavar="FILE", help='JSONL: one {"prompt": "..."} per line')
    r.add_argument("--seeds", default="42,43,44", help="comma-separated seeds (default 42,43,44)")
    r.add_argument("--max-tokens", type=int, default=8192, help="per answer; answers are never clipped after")
    for name, helptext in (("resume", "continue a run"), ("grade", "grade a run blind"), ("reveal", "show the result")):
        q = sub.add_parser(name, help=helptext)
        q.add_argument("run_id")
        if name == "reveal":
            q.add_argument("--json", action="store_true")
    sub.add_parser("list", help="list A/B runs")
    p.set_defaults(func=run)


def _services(settings):
    from app.backend.abtest.runner import ABRunService
    from app.backend.engine.factory import make_engine_controller

    ctl = make_engine_controller(settings)
    return ctl, ABRunService(settings, ctl)


def _follow(svc) -> int:
    from app.backend.selftest.runner import JobState

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


def run(args: argparse.Namespace) -> int:
    from app.backend.abtest.grading import blind_pairs, grade_from_pick, reveal, reveal_markdown
    from app.backend.abtest.journal import Journal, new_spec, parse_prompts_jsonl

    settings = resolve_settings(args.recipe, args.data_dir)
    journal = Journal(settings.ensure_state_dir())
    try:
        if args.ab_cmd == "list":
            for rid in journal.runs():
                st = journal.load(rid)
                print(f"{rid}  A={st.spec.profile_a} B={st.spec.profile_b}  {st.generated}/{st.total} answers, "
                      f"{len(st.grades)}/{len(st.spec.cells)} graded")
            return 0
        if args.ab_cmd in ("run", "resume"):
            if args.ab_cmd == "run":
                prompts = parse_prompts_jsonl(Path(args.prompts).read_text(encoding="utf-8"))
                seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
                spec = new_spec(args.profile_a, args.profile_b, prompts, seeds, args.max_tokens)
            ctl, svc = _services(settings)
            try:
                p = svc.start(spec) if args.ab_cmd == "run" else svc.resume(args.run_id)
                print(f"A/B run {p.run_id}: {p.total} answers; Ctrl-C stops (resume continues)", file=sys.stderr)
                return _follow(svc)
            finally:
                ctl.close()
        st = journal.load(args.run_id)
        if args.ab_cmd == "grade":
            for bp in [b for b in blind_pairs(st) if not b.graded]:
                print(f"\n=== pair {bp.index + 1} (prompt {bp.prompt_id}, seed {bp.seed}) ===\n{bp.prompt}\n"
                      f"\n--- LEFT ---\n{bp.left}\n\n--- RIGHT ---\n{bp.right}\n")
                ans = ""
                while ans not in ("l", "r", "t", "q"):
                    ans = input("better: l(eft) / r(ight) / t(ie) / q(uit)? ").strip().lower()[:1]
                if ans == "q":
                    break
                pick = {"l": "left", "r": "right", "t": "tie"}[ans]
                journal.append(st.spec.run_id, grade_from_pick(st, bp.prompt_id, bp.seed, pick))
            return 0
        rv = reveal(st)
        print(json.dumps(asdict(rv), indent=2) if args.json else reveal_markdown(rv))
        return 0
    except (ValueError, OSError) as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        return 2
