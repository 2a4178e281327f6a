"""`moet-panel trace summarize LOGFILE [--json]`: the pool's numbers from an engine log, checkable by hand."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from app.backend.contracts import count_text
from app.backend.telemetry.trace import Summary, TraceParser
from app.backend.telemetry.trace_report import summarize_parser
from app.cli.main import add_common


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("trace", help="read the engine's FP4 pool trace ([delta] tick lines)")
    add_common(p)
    tsubs = p.add_subparsers(dest="trace_command", metavar="ACTION")
    s = tsubs.add_parser("summarize", help="last summary + whole-file figures (coverage, churn, alerts)")
    s.add_argument("logfile", help="engine log file ('-' = stdin); docker logs output works as-is")
    add_common(s)
    s.set_defaults(func=run)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def run(args: argparse.Namespace) -> int:
    parser = TraceParser()
    seen: dict[str, list[Summary]] = {}
    parser.on_summary = lambda rank, s: seen.setdefault(rank, []).append(s)
    try:
        if args.logfile == "-":
            for chunk in iter(lambda: sys.stdin.read(1 << 16), ""):
                parser.feed(chunk)
        else:
            with Path(args.logfile).open("r", encoding="utf-8", errors="replace") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), ""):
                    parser.feed(chunk)
    except OSError as exc:
        print(f"moet-panel: cannot read {args.logfile}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    parser.flush()
    report = summarize_parser(parser, seen)
    if args.json:
        print(json.dumps(report, indent=2, default=_json_default))
    else:
        print(render_text(report))
    return 0


def _json_default(o):
    if hasattr(o, "__dataclass_fields__"):
        return asdict(o)
    return str(o)


def render_text(r: dict) -> str:
    out = [f"{r['lines']} lines, {r['summaries']} summary lines, {count_text(len(r['ranks']), 'rank')}"]
    if r["sizing"]:
        sz = r["sizing"]
        out.append(f"pool sizing: {sz['text']}")
    if r["trace_level"] is not None:
        out.append(f"trace: level {r['trace_level']}, every {r['trace_every']} ticks")
    for rk in r["ranks"]:
        out.append(f"\n[{rk['rank']}]")
        last = rk["last"]
        if last is None:
            out.append("  no [delta] tick summary lines (trace off, or no traffic served)")
            continue
        out += [
            f"  tick                {last['tick']}",
            f"  slots filled        {last['cached']}/{last['slots']}",
            f"  experts covered     {last['covered']}/{last['total']} ({last['covered_pct']}%)",
            f"  pool coverage       {last['hit_tokens_pct']}% of token→expert routings at FP4 (the card's ~57%)",
            f"  hit-rate experts    {last['hit_experts_pct']}%",
            f"  window              +{last['win_promoted']}/-{last['win_evicted']}",
            f"  cumulative          +{last['cum_promoted']}/-{last['cum_evicted']}",
        ]
        f = rk["file"]
        out.append(f"  over the file       {f['summaries']} summaries over {_fmt(f['span_s'], 's')}; coverage mean "
                   f"{_fmt(f['coverage_mean_pct'], '%')} (min {_fmt(f['coverage_min_pct'], '%')}, max "
                   f"{_fmt(f['coverage_max_pct'], '%')})")
        out.append(f"  churn               {_fmt(f['churn_per_s'], ' slots/s')} (+{_fmt(f['promotions_per_s'], '/s')}"
                   f" -{_fmt(f['evictions_per_s'], '/s')}); est. host→device {_fmt(f['h2d_gib_s'], ' GiB/s', 3)}")
    out.append("")
    if not r["alerts"]:
        out.append("alerts: none")
    for a in r["alerts"]:
        out.append(f"ALERT [{a['severity']}] {a['title']}\n  means: {a['meaning']}\n  do:    {a['action']}")
    return "\n".join(out)


def _fmt(v, unit: str, nd: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{nd}f}{unit}"
