"""Trace parser throughput: lines/s on a large log generated from the engine-log fixtures.

    python bench/trace_parser/run.py [--lines 1000000]

Prints the incremental parser (chunked `feed`, as `trace summarize` reads files, and per-line
`feed_line`, as the hub drains engine log lines) next to a naive baseline run in the same process:
strip ANSI, match the vLLM prefix regex, then try one regex per line kind (docs/simengine.md) in turn. Target ≥ 200k lines/s.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.backend.telemetry.trace import TraceParser  # noqa: E402

FIXTURES = ROOT / "tests" / "telemetry" / "fixtures" / "engine-logs"
PREFIX = re.compile(r"^(?:\((?P<proc>[^) ]+) pid=(?P<pid>\d+)\) )?(?P<lvl>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                    r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) \[(?P<src>[^\]:]+):(?P<srcline>\d+)\] (?P<msg>.*)$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NAIVE = [re.compile(p) for p in (
    r"^\[(?P<tag>[a-z0-9]+)\] tick (?P<tick>\d+): (?:FP4 )?(?P<cached>\d+)/(?P<slots>\d+) slots, covering "
    r"(?P<cov>\d+)/(?P<total>\d+) experts \((?P<cov_pct>[\d.]+)%\); hit-rate (?P<hit_tok>[\d.]+)% tokens / "
    r"(?P<hit_exp>[\d.]+)% experts; window \+(?P<win_p>\d+)/-(?P<win_e>\d+), cumulative \+(?P<cum_p>\d+)/-(?P<cum_e>\d+)$",
    r"^\[(?P<tag>[a-z0-9]+)\] (?:FP4 )?experts per layer: (?P<pairs>(?:L\d+:\d+ ?)+)$",
    r"^\[(?P<tag>[a-z0-9]+)\] promote L(?P<layer>\d+)\s+E(?P<expert>\d+)\s+slot (?P<slot>\d+)\s+\(tick (?P<tick>\d+)\)$",
    r"^\[(?P<tag>[a-z0-9]+)\] evict\s+L(?P<layer>\d+)\s+E(?P<expert>\d+)\s+slot (?P<slot>\d+)\s+\(cold (?P<cold>\d+) ticks\)$",
    r"^\[(?P<tag>[a-z0-9]+)\] force-promote (?P<n>\d+) experts \(gate\)$",
    r"^\[need\] low-conf routing top1%/5%/10% = (\d+)/(\d+)/(\d+)\s+\|\s+all routing top1%/5%/10% = (\d+)/(\d+)/(\d+)"
    r"\s+\|\s+experts need>0: (\d+)/(\d+)$",
    r"^\[(?P<tag>[a-z0-9]+)\] pack store: (?P<reads>\d+) row reads, (?P<gib>[\d.]+) GiB total$",
    r"^moe_w2 delta tier: (?P<slots>\d+) slots x (?P<mib>[\d.]+) MiB \((?P<gib>[\d.]+) GiB pool\)$",
    r"^\[gate\] (?P<kind>fire|audit): (?P<signal>\w+) worst=(?P<worst>[-\d.]+) (?:<=|>)\s+tau=(?P<tau>[-\d.]+) \(step (?P<step>\d+)\)$",
)]


def naive(lines: list[str]) -> int:
    hits = 0
    for line in lines:
        line = ANSI.sub("", line)
        m = PREFIX.match(line)
        msg = m.group("msg") if m else line
        for rx in NAIVE:
            if rx.match(msg):
                hits += 1
                break
    return hits


def build(n_lines: int, events: bool = True) -> list[str]:
    base: list[str] = []
    for f in sorted(FIXTURES.glob("*.log")):
        base += [ln for ln in f.read_text().splitlines() if events or not ("] promote " in ln or "] evict " in ln)]
    base += ["(APIServer pid=1) INFO:     127.0.0.1:40000 - \"GET /metrics HTTP/1.1\" 200 OK",
             "\x1b[32mINFO\x1b[0m 08-22 14:03:11 [core.py:1] some unrelated upstream vLLM line"]
    reps = n_lines // len(base) + 1
    return (base * reps)[:n_lines]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=1_000_000)
    args = ap.parse_args()
    for events in (True, False):
        bench(build(args.lines, events), "TRACE=2 mix (promote/evict lines)" if events else "TRACE=1 mix (no event lines)")
    return 0


def bench(lines: list[str], title: str) -> None:
    print(f"== {title}")
    text = "\n".join(lines) + "\n"
    mb = len(text.encode()) / 2**20
    summaries = sum(1 for ln in lines if "] tick " in ln)
    events = sum(1 for ln in lines if "] promote " in ln or "] evict " in ln)
    print(f"log: {len(lines):,} lines ({mb:.0f} MiB), {summaries:,} summaries, {events:,} promote/evict lines")

    def chunked():
        p = TraceParser()
        for i in range(0, len(text), 1 << 20):
            p.feed(text[i : i + (1 << 20)])
        p.flush()
        assert p.summaries == summaries, (p.summaries, summaries)

    def per_line():
        p = TraceParser()
        for ln in lines:
            p.feed_line(ln)

    results = []
    for name, fn in (("parser, chunked feed()", chunked), ("parser, feed_line() per line", per_line),
                     ("naive: prefix regex + one regex per line kind", lambda: naive(lines))):
        best = min(timed(fn) for _ in range(3))
        results.append((name, len(lines) / best))
    base = results[-1][1]
    for name, rate in results:
        print(f"{name:40s} {rate / 1e3:8.0f}k lines/s   ×{rate / base:.1f} vs naive")
    ok = min(r for _, r in results[:2]) >= 200_000
    print(f"target ≥ 200k lines/s: {'MET' if ok else 'NOT MET'}")


if __name__ == "__main__":
    sys.exit(main())
