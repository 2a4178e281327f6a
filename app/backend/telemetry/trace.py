"""Incremental parser for the engine's FP4 delta-pool trace (docs/simengine.md#the-formats-the-panel-parses).

Feed it raw chunks (`feed`) or whole lines (`feed_line`); it keeps one `RankState` per TP rank /
process (`(Worker_TP1 pid=N) ` prefixes are interleaved in one stream) and derives the card's
numbers: pool coverage = the summary's token hit-rate ("~57% of token→expert routings served at
FP4"), experts resident, pool fill, churn per second and estimated host→device GiB/s.

Speed matters (a TRACE=2 engine prints thousands of promote/evict lines a second), so lines are
dispatched by cheap string tests and only the rare summary/boot lines go through a regex.

Examples:
    >>> p = TraceParser()
    >>> p.feed_line("INFO 08-22 14:03:11 [moe_w2_delta.py:1867] [delta] tick 4160: 469/469 slots, "
    ...             "covering 469/11008 experts (4.3%); hit-rate 41.7% tokens / 12.9% experts; "
    ...             "window +16/-16, cumulative +3024/-2555")
    >>> p.snapshot().coverage_pct
    41.7
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from app.backend.contracts import PoolSizing
from app.backend.engine.logs.loglines import pool_sizing, unknown_pool_form
from app.backend.contracts import GiB

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
SUMMARY_RE = re.compile(
    r"tick (?P<tick>\d+): (?P<fp4>FP4 )?(?P<cached>\d+)/(?P<slots>\d+) slots, covering (?P<cov>\d+)/(?P<total>\d+)"
    r" experts \((?P<cov_pct>[\d.]+)%\); hit-rate (?P<hit_tok>[\d.]+)% tokens / (?P<hit_exp>[\d.]+)% experts;"
    r" window \+(?P<win_p>\d+)/-(?P<win_e>\d+), cumulative \+(?P<cum_p>\d+)/-(?P<cum_e>\d+)\s*$"
)
TRACE_ON_RE = re.compile(r"^moe_w2 delta trace ON: level (?P<level>\d+), every (?P<every>\d+) ticks")
NEED_RE = re.compile(
    r"low-conf routing top1%/5%/10% = (\d+)/(\d+)/(\d+)\s+\|\s+all routing top1%/5%/10% = (\d+)/(\d+)/(\d+)"
    r"\s+\|\s+experts need>0: (\d+)/(\d+)"
)
STORE_RE = re.compile(r"pack store: (?P<reads>\d+) row reads, (?P<gib>[\d.]+) GiB total")
TIERED_RE = re.compile(r"tiered store: arena (?P<used>\d+)/(?P<slots>\d+) slots .*\((?P<ram_pct>[\d.]+)% ram\)")
FORCE_RE = re.compile(r"force-promote (?P<n>\d+) experts \(gate\)")

# Rates are computed over at least this much wall time: line timestamps have 1 s resolution.
RATE_MIN_SPAN_S = 2.0
HISTORY = 64  # summaries kept per rank for rates and the CLI


@dataclass(slots=True)
class Summary:
    """One `[tag] tick N: …` summary line (its format: docs/simengine.md), with its wall-clock time. Treat as immutable
    (not frozen only because frozen dataclasses are ~3× slower to build on the parser's hot path)."""

    tag: str
    tick: int
    cached: int
    slots: int
    covered: int
    total: int
    covered_pct: float  # experts resident / all experts (covering C/T)
    hit_tokens_pct: float  # the card's "pool coverage": routings served at FP4
    hit_experts_pct: float
    win_promoted: int
    win_evicted: int
    cum_promoted: int
    cum_evicted: int
    ts: float | None = None
    old_format: bool = False


@dataclass
class RankState:
    """Everything known about one rank/process, updated line by line."""

    key: str
    sizing: PoolSizing | None = None
    trace_level: int | None = None
    trace_every: int | None = None
    summaries: int = 0
    last: Summary | None = None
    history: deque[Summary] = field(default_factory=lambda: deque(maxlen=HISTORY))
    per_layer_text: str = ""  # raw `L0:14 L1:9 …` payload of the last histogram line (parsed on demand)
    pack_reads: int | None = None
    pack_gib: float | None = None
    tiered_arena: tuple[int, int] | None = None
    need: tuple[int, ...] | None = None
    promote_lines: int = 0
    evict_lines: int = 0
    force_promoted: int = 0
    gate_fires: int = 0
    gate_audits: int = 0
    dump_failures: int = 0
    last_line_ts: float | None = None

    @property
    def per_layer(self) -> dict[int, int]:
        """{layer: FP4 experts} from the last `experts per layer` line."""
        out: dict[int, int] = {}
        for pair in self.per_layer_text.split():
            a, _, b = pair[1:].partition(":")
            if pair[:1] == "L" and a.isdigit() and b.isdigit():
                out[int(a)] = int(b)
        return out

    def rates(self) -> tuple[float | None, float | None]:
        """(promotions/s, evictions/s) over the most recent summaries spanning ≥ RATE_MIN_SPAN_S."""
        hist = self.history
        if len(hist) < 2 or hist[-1].ts is None:
            return None, None
        end = hist[-1].ts
        ref = end
        p = e = 0
        for i in range(len(hist) - 1, 0, -1):
            p += hist[i].win_promoted
            e += hist[i].win_evicted
            prev = hist[i - 1].ts
            if prev is None:
                return None, None
            ref = prev
            if end - ref >= RATE_MIN_SPAN_S:
                break
        span = end - ref
        if span < RATE_MIN_SPAN_S:  # e.g. a backlog replayed in one burst: no honest rate yet
            return None, None
        return p / span, e / span


@dataclass(frozen=True)
class RankView:
    key: str
    last: Summary | None
    sizing: PoolSizing | None
    promotions_per_s: float | None
    evictions_per_s: float | None
    summaries: int

    @property
    def churn_per_s(self) -> float | None:
        if self.promotions_per_s is None:
            return None
        return self.promotions_per_s + (self.evictions_per_s or 0.0)

    @property
    def replacements_per_s(self) -> float | None:
        """Slots swapped (evict + promote) per second — fill-up of a half-empty pool is not churn."""
        if self.promotions_per_s is None:
            return None
        return min(self.promotions_per_s, self.evictions_per_s or 0.0)

    @property
    def slot_bytes(self) -> float | None:
        return self.sizing.slot_mib * 2**20 if self.sizing and self.sizing.slot_mib else None

    @property
    def h2d_gib_s(self) -> float | None:
        """Estimated host→device traffic: promotions/s × slot size (evictions copy nothing)."""
        if self.promotions_per_s is None or self.slot_bytes is None:
            return None
        return self.promotions_per_s * self.slot_bytes / GiB


@dataclass(frozen=True)
class TraceSnapshot:
    """Derived pool state across ranks (cheap to build, immutable)."""

    ranks: tuple[RankView, ...] = ()
    lines: int = 0
    summaries: int = 0
    trace_on: bool | None = None  # True: "trace ON" boot line seen; None: unknown
    sizing: PoolSizing | None = None
    last_summary_ts: float | None = None
    force_promoted: int = 0
    gate_fires: int = 0
    need: tuple[int, ...] | None = None
    gate_audits: int = 0
    # A pool line of a form this parser cannot read (a newer/older build), when nothing of that kind was
    # understood: the header and Telemetry tab then say "this build's pool trace is not understood" instead
    # of a blank or a wrong number (issue 45, docs/engine.md "Upgrading the engine").
    unknown_form: str | None = None

    @property
    def understood(self) -> bool:
        return self.unknown_form is None

    @property
    def primary(self) -> RankView | None:
        with_summary = [r for r in self.ranks if r.last is not None]
        return with_summary[0] if with_summary else (self.ranks[0] if self.ranks else None)

    @property
    def coverage_pct(self) -> float | None:
        """Headline: share of token→expert routings served at FP4 (mean over ranks' last summaries)."""
        vals = [r.last.hit_tokens_pct for r in self.ranks if r.last is not None]
        return round(sum(vals) / len(vals), 2) if vals else None

    @property
    def expert_hit_pct(self) -> float | None:
        vals = [r.last.hit_experts_pct for r in self.ranks if r.last is not None]
        return round(sum(vals) / len(vals), 2) if vals else None

    @property
    def churn_per_s(self) -> float | None:
        p = self.primary
        return p.churn_per_s if p else None

    @property
    def h2d_gib_s(self) -> float | None:
        """Sum over ranks: each rank copies its own slice over its own link."""
        vals = [r.h2d_gib_s for r in self.ranks if r.h2d_gib_s is not None]
        return sum(vals) if vals else None

    @property
    def pool_disabled(self) -> bool:
        if self.sizing is not None and self.sizing.disabled:
            return True
        return any(r.last is not None and r.last.slots == 0 for r in self.ranks)


def _prefix_ts(ts_text: str, year: int) -> float | None:
    """'MM-DD HH:MM:SS' (vLLM's stamp, local time, no year) → epoch seconds; strptime is 50× slower."""
    try:
        mo, d, h, mi, sec = int(ts_text[0:2]), int(ts_text[3:5]), int(ts_text[6:8]), int(ts_text[9:11]), int(ts_text[12:14])
        return datetime(year, mo, d, h, mi, sec).timestamp()
    except ValueError:
        return None


class TraceParser:
    """Stateful, incremental; not thread-safe (the hub feeds it from one thread)."""

    def __init__(self, year: int | None = None) -> None:
        self._year = year or time.localtime().tm_year
        self._partial = ""
        self._ranks: dict[str, RankState] = {}
        self._ts_cache: tuple[str, float | None] = ("", None)
        self.lines = 0
        self.summaries = 0
        self.trace_on: bool | None = None
        self.last_summary_ts: float | None = None
        self.on_summary: Callable[[str, Summary], None] | None = None  # called with (rank key, summary)
        self._unknown_forms: dict[str, str] = {}  # kind -> first unreadable line of that kind

    # -- input -------------------------------------------------------------------------------
    def feed(self, chunk: str) -> None:
        """Feed raw output; an unterminated last line is kept until the next chunk."""
        if not chunk:
            return
        data = self._partial + chunk
        lines = data.split("\n")
        self._partial = lines.pop()
        for line in lines:
            self.feed_line(line)

    def flush(self) -> None:
        """Parse a pending unterminated line (end of file)."""
        if self._partial:
            line, self._partial = self._partial, ""
            self.feed_line(line)

    def feed_line(self, line: str, ts: float | None = None) -> None:
        """One complete line; `ts` (epoch seconds) overrides the line's own 1 s-resolution stamp."""
        self.lines += 1
        if "\x1b" in line:
            line = ANSI_RE.sub("", line)
        if line[:2] == "20" and line[10:11] == "T":  # `docker logs -t`: RFC 3339 stamp first
            line = line[line.find(" ") + 1 :]
        # Cheap prefilters (C-speed substring scans) before any slicing: TRACE=2 output is ~95%
        # promote/evict lines, and most other engine output is not pool-related at all.
        if "] promote " in line:
            self._event(line, True)
            return
        if "] evict " in line:
            self._event(line, False)
            return
        if ("] [" not in line and "moe_w2 delta" not in line and "delta dump to" not in line and line[:1] != "["
                and "moe_w2 EXL3 " not in line):
            return
        line = line.rstrip("\r\n")
        proc = "main"
        rest = line
        if line.startswith("("):
            j = line.find(") ")
            if j > 0:
                head = line[1:j]
                sp = head.find(" pid=")
                proc = head[:sp] if sp > 0 else head
                rest = line[j + 2 :]
        ts_text = ""
        msg = rest
        if rest[:4] in ("INFO", "WARN", "DEBU", "ERRO", "CRIT"):
            sp = rest.find(" ")
            k = rest.find("] ", sp)
            if sp > 0 and k > 0 and rest[sp + 15 : sp + 17] == " [":
                ts_text = rest[sp + 1 : sp + 15]
                msg = rest[k + 2 :]
        first = msg[:1]
        if first != "[" and not msg.startswith(("moe_w2 delta ", "delta dump to ", "moe_w2 EXL3 ")):
            # an unknown prefix (log shipper, custom VLLM_LOGGING_PREFIX): find the message in it
            msg = _after_unknown_prefix(msg)
            first = msg[:1]
        if first == "[":
            self._tagged(proc, msg, ts_text, ts)
        elif first == "m" and msg.startswith(("moe_w2 delta ", "moe_w2 EXL3 ")):
            self._boot(proc, msg)
        elif first == "d" and msg.startswith("delta dump to "):
            self._rank(proc).dump_failures += 1

    # -- dispatch ----------------------------------------------------------------------------
    def _event(self, line: str, promote: bool) -> None:
        """A per-event promote/evict line: count it for its rank, nothing else."""
        proc = "main"
        if line[:1] == "(":
            j = line.find(" pid=")
            if 0 < j < line.find(") "):
                proc = line[1:j]
        st = self._ranks.get(proc) or self._rank(proc)
        if promote:
            st.promote_lines += 1
        else:
            st.evict_lines += 1

    def _rank(self, proc: str) -> RankState:
        st = self._ranks.get(proc)
        if st is None:
            st = self._ranks[proc] = RankState(key=proc)
        return st

    def _ts(self, ts_text: str, ts: float | None) -> float | None:
        if ts is not None:
            return ts
        if not ts_text:
            return None
        if self._ts_cache[0] != ts_text:
            self._ts_cache = (ts_text, _prefix_ts(ts_text, self._year))
        return self._ts_cache[1]

    def _tagged(self, proc: str, msg: str, ts_text: str, ts: float | None) -> None:
        k = msg.find("] ")
        if k < 0:
            return
        tag = msg[1:k]
        body = msg[k + 2 :]
        b0 = body[:1]
        if b0 == "p" and body.startswith("promote "):
            self._rank(proc).promote_lines += 1
        elif b0 == "e" and body.startswith("evict "):
            self._rank(proc).evict_lines += 1
        elif b0 == "t" and body.startswith("tick "):
            self._summary(proc, tag, body, ts_text, ts)
        elif "experts per layer: " in body:
            self._histogram(proc, body)
        elif tag == "need":
            m = NEED_RE.search(body)
            if m:
                self._rank(proc).need = tuple(int(x) for x in m.groups())
        elif tag == "gate":
            st = self._rank(proc)
            if body.startswith("fire:"):
                st.gate_fires += 1
            elif body.startswith("audit:"):
                st.gate_audits += 1
        elif b0 == "f" and body.startswith("force-promote "):
            m = FORCE_RE.match(body)
            if m:
                self._rank(proc).force_promoted += int(m.group("n"))
        elif b0 == "p" and body.startswith("pack store: "):
            m = STORE_RE.match(body)
            if m:
                st = self._rank(proc)
                st.pack_reads, st.pack_gib = int(m.group("reads")), float(m.group("gib"))
        elif b0 == "t" and body.startswith("tiered store: "):
            m = TIERED_RE.match(body)
            if m:
                self._rank(proc).tiered_arena = (int(m.group("used")), int(m.group("slots")))

    def _summary(self, proc: str, tag: str, body: str, ts_text: str, ts: float | None) -> None:
        m = SUMMARY_RE.match(body)
        if not m:  # another build's summary form (or a garbled line): never guess a number from it
            self._unknown("summary", f"[{tag}] {body}")
            return
        tick, fp4, cached, slots, cov, total, cov_pct, hit_tok, hit_exp, wp, we, cp, ce = m.groups()
        s = Summary(tag, int(tick), int(cached), int(slots), int(cov), int(total), float(cov_pct), float(hit_tok),
                    float(hit_exp), int(wp), int(we), int(cp), int(ce), self._ts(ts_text, ts), fp4 is not None)
        st = self._rank(proc)
        st.summaries += 1
        st.last = s
        st.history.append(s)
        st.last_line_ts = s.ts
        if s.cached == 0:
            st.per_layer_text = ""
        self.summaries += 1
        self.last_summary_ts = s.ts if s.ts is not None else time.time()
        if self.on_summary is not None:
            self.on_summary(proc, s)

    def _histogram(self, proc: str, body: str) -> None:
        self._rank(proc).per_layer_text = body.split("experts per layer: ", 1)[1]

    def _boot(self, proc: str, msg: str) -> None:
        st = self._rank(proc)
        if msg.startswith("moe_w2 delta trace ON"):
            m = TRACE_ON_RE.match(msg)
            if m:
                st.trace_level, st.trace_every = int(m.group("level")), int(m.group("every"))
                self.trace_on = True
            return
        ps = pool_sizing(msg)  # the one sizing parser, shared with engine/logs/bootlog.py
        if ps is None:
            if unknown_pool_form(msg):
                self._unknown("sizing", msg)
            return
        if ps.slots is None and not ps.deferred and st.sizing is not None:
            return  # an EXL3 staging line names the slot size only: keep a sizing already read
        if ps.disabled and ps.auto:  # the AUTO "pool disabled" line names no slot size: keep the deferred line's
            ps = replace(ps, slot_mib=st.sizing.slot_mib if st.sizing else None)
        st.sizing = ps

    def _unknown(self, kind: str, text: str) -> None:
        if kind not in self._unknown_forms:
            self._unknown_forms[kind] = text[:200]

    # -- output ------------------------------------------------------------------------------
    def unknown_form(self) -> str | None:
        """A sample unreadable pool line, when no line of its kind (summary / sizing) was read."""
        sizing_known = any(st.sizing is not None for st in self._ranks.values())
        if "sizing" in self._unknown_forms and not sizing_known:
            return self._unknown_forms["sizing"]
        if "summary" in self._unknown_forms and self.summaries == 0:
            return self._unknown_forms["summary"]
        return None

    def rank_states(self) -> dict[str, RankState]:
        return self._ranks

    def snapshot(self) -> TraceSnapshot:
        views = []
        for key in sorted(self._ranks):
            st = self._ranks[key]
            p, e = st.rates()
            views.append(RankView(key, st.last, st.sizing, p, e, st.summaries))
        sizing = next((v.sizing for v in views if v.sizing is not None), None)
        need = next((st.need for st in self._ranks.values() if st.need is not None), None)
        return TraceSnapshot(
            ranks=tuple(views),
            lines=self.lines,
            summaries=self.summaries,
            trace_on=self.trace_on,
            sizing=sizing,
            last_summary_ts=self.last_summary_ts,
            force_promoted=sum(st.force_promoted for st in self._ranks.values()),
            gate_fires=sum(st.gate_fires for st in self._ranks.values()),
            need=need,
            gate_audits=sum(st.gate_audits for st in self._ranks.values()),
            unknown_form=self.unknown_form(),
        )


def _after_unknown_prefix(msg: str) -> str:
    for marker, skip in (("] [", 2), ("moe_w2 delta ", 0), ("delta dump to ", 0)):
        k = msg.find(marker)
        if k >= 0:
            return msg[k + skip :]
    return msg


def parse_text(text: str, year: int | None = None) -> TraceParser:
    """Parse a whole log text (helper for the CLI and tests)."""
    parser = TraceParser(year=year)
    parser.feed(text)
    parser.flush()
    return parser


__all__ = ["Summary", "RankState", "RankView", "TraceSnapshot", "TraceParser", "parse_text"]
