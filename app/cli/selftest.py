"""`moet-panel selftest --profile ID [--runs N] [--needle 64k,256k] [--json]`: measure the serving
profile against the card's figures (docs/selftest.md). Never starts, stops or switches the engine."""

from __future__ import annotations

import argparse
import sys

from app.cli.main import add_common, settings_from


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("selftest", help="measure the running profile against the card (decode, TTFT, needles)")
    add_common(p, json_help="print the result as JSON (else Markdown)")
    p.add_argument("--profile", required=True, help="profile id; the engine must already serve it")
    p.add_argument("--runs", type=int, default=3, help="decode runs (default 3)")
    p.add_argument("--decode-tokens", type=int, default=2000, help="tokens per decode run (default 2000)")
    p.add_argument("--needle", default="64k,256k", help="needle lengths, e.g. 64k,256k ('' = none)")
    p.add_argument("--ttft", default="1k,8k,32k", help="prompt lengths for TTFT ('' = none)")
    p.add_argument("--gpu", metavar="N", help="a box of several GPUs: the GPU whose engine to measure (default 0); "
                   "the others keep serving (docs/engine.md \"Several GPUs\")")
    p.add_argument("--build", metavar="ID", help="the engine build that must be serving (it is recorded as this "
                   "build's evidence; `moet-panel engine builds`)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.backend.state import make_box_gpus
    from app.backend.engine.gpus import GpuSelectionError, parse_gpus
    from app.backend.engine.lifecycle.tickets import ControllerOptions
    from app.backend.telemetry.gpu import box_gpu_count, follow_engine, make_gpu_reader
    from app.backend.selftest.needle import parse_lengths
    from app.backend.selftest.report import to_json_text, to_markdown
    from app.backend.jobs import JobState
    from app.backend.selftest.runner import SelfTestService
    from app.backend.selftest.types import SelfTestPlan

    settings = settings_from(args)
    try:
        plan = SelfTestPlan(args.profile, runs=args.runs, decode_tokens=args.decode_tokens,
                            ttft_lengths=tuple(parse_lengths(args.ttft)), needle_lengths=tuple(parse_lengths(args.needle)))
    except ValueError as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        return 2
    reader = make_gpu_reader(settings)
    box = make_box_gpus(settings, reader, box_gpu_count(reader), lambda gpu: ControllerOptions(actor="CLI"))
    for g in box.gpus:
        follow_engine(reader, box.controller(g), g)
    try:
        try:
            gpu = parse_gpus(args.gpu, box.gpus)[0] if args.gpu is not None else box.gpus[0]
        except GpuSelectionError as exc:
            print(f"moet-panel: {exc}", file=sys.stderr)
            return 2
        multi = len(box.gpus) > 1
        svc = SelfTestService(settings, box.controller(box.gpus[0]), gpu=box.gpus[0] if multi else None,
                              engines={g: box.controller(g) for g in box.gpus} if multi else None)
        on = gpu if multi else None
        if why := svc.check(args.profile, args.build, gpu=on):
            print(f"moet-panel: {why}", file=sys.stderr)
            return 1
        print(f"self-test of {args.profile}: about {svc.estimate_s(plan) / 60:.1f} min; Ctrl-C cancels",
              file=sys.stderr, flush=True)
        last = [""]

        def show(p) -> None:
            if p.step != last[0]:
                last[0] = p.step
                print(f"  {p.fraction:4.0%}  {p.step}", file=sys.stderr, flush=True)

        p = svc.run_blocking(plan, show, gpu=on)
    finally:
        box.close()
    if p.state is not JobState.DONE or p.result is None:
        print(f"moet-panel: self-test {p.state.value}: {p.message}", file=sys.stderr)
        return 130 if p.state is JobState.CANCELLED else 1
    print(to_json_text(p.result) if args.json else to_markdown(p.result))
    return 0
