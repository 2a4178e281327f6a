"""Whole-file trace report (for `moet-panel trace summarize`): last summary per rank + file-wide rates."""

from __future__ import annotations

from dataclasses import asdict

from app.backend.alerts.rules import AlertInputs, churn_trap, pool_absent, zero_coverage
from app.backend.contracts import PoolSizing
from app.backend.telemetry.trace import Summary, TraceParser


def file_stats(sums: list[Summary], slot_mib: float | None) -> dict[str, object]:
    """Rates over the whole file: Σ window(+p/-e) after the first summary ÷ first→last wall time."""
    out: dict[str, object] = {"summaries": len(sums), "span_s": None, "promotions_per_s": None, "evictions_per_s": None,
                 "churn_per_s": None, "h2d_gib_s": None, "coverage_mean_pct": None,
                 "coverage_min_pct": None, "coverage_max_pct": None}
    if sums:
        cov = [s.hit_tokens_pct for s in sums]
        out.update(coverage_mean_pct=round(sum(cov) / len(cov), 2), coverage_min_pct=min(cov),
                   coverage_max_pct=max(cov))
    if len(sums) >= 2 and sums[0].ts is not None and sums[-1].ts is not None:
        span = sums[-1].ts - sums[0].ts
        out["span_s"] = span
        if span > 0:
            p = sum(s.win_promoted for s in sums[1:]) / span
            e = sum(s.win_evicted for s in sums[1:]) / span
            out.update(promotions_per_s=p, evictions_per_s=e, churn_per_s=p + e)
            if slot_mib:
                out["h2d_gib_s"] = p * slot_mib / 1024
    return out


def summarize_parser(parser: TraceParser, seen: dict[str, list[Summary]]) -> dict[str, object]:
    snap = parser.snapshot()
    states = parser.rank_states()
    ranks = []
    for view in snap.ranks:
        st = states[view.key]
        slot_mib = view.sizing.slot_mib if view.sizing else (snap.sizing.slot_mib if snap.sizing else None)
        ranks.append({
            "rank": view.key,
            "last": asdict(view.last) if view.last else None,
            "recent_promotions_per_s": view.promotions_per_s,
            "recent_evictions_per_s": view.evictions_per_s,
            "recent_h2d_gib_s": view.h2d_gib_s,
            "per_layer": st.per_layer,
            "pack_store": {"reads": st.pack_reads, "gib": st.pack_gib} if st.pack_reads is not None else None,
            "need": st.need,
            "promote_lines": st.promote_lines,
            "evict_lines": st.evict_lines,
            "force_promoted": st.force_promoted,
            "gate_fires": st.gate_fires,
            "file": file_stats(seen.get(view.key, []), slot_mib),
        })
    inputs = AlertInputs(trace=snap)
    alerts = [a for rule in (pool_absent, zero_coverage, churn_trap) if (a := rule(inputs)) is not None]
    sz = snap.sizing
    level = next((st.trace_level for st in states.values() if st.trace_level is not None), None)
    every = next((st.trace_every for st in states.values() if st.trace_every is not None), None)
    return {
        "lines": snap.lines,
        "summaries": snap.summaries,
        "coverage_pct": snap.coverage_pct,
        "expert_hit_pct": snap.expert_hit_pct,
        "trace_level": level,
        "trace_every": every,
        "sizing": ({**asdict(sz), "disabled": sz.disabled, "text": _sizing_text(sz)} if sz else None),
        "ranks": ranks,
        "alerts": [asdict(a) for a in alerts],
    }


def _sizing_text(sz: PoolSizing) -> str:
    if sz.disabled:
        why = (f" — auto: {sz.free_after_kv_gib:.2f} GiB free after KV < reserve {sz.reserve_gib} GiB"
               if sz.free_after_kv_gib is not None else "")
        return f"pool DISABLED (0 slots){why}"
    if sz.deferred:
        return f"auto-sizing deferred (slot {sz.slot_mib} MiB)"
    return f"{sz.slots} slots x {sz.slot_mib} MiB ({sz.pool_gib} GiB pool){' [auto]' if sz.auto else ''}"
