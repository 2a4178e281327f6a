"""Verdicts and exports of a self-test: beside the card's figure, as Markdown or JSON to share.

The card's decode figures are "reproducible to ±1 tok/s across seeds" (profile 1: ±0.2 across 5
seeds), so a median within 1 tok/s of the card is "as the card"; below that the verdict names the
likely cause from what the telemetry saw during the run.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass

from app.backend.selftest.types import NeedleOutcome, SelfTestResult

CARD_TOLERANCE_TOK_S = 1.0


@dataclass(frozen=True)
class DecodeSummary:
    median: float
    spread: float  # half the range (max - min) / 2: the card quotes "±" this way
    runs: int


def decode_summary(r: SelfTestResult) -> DecodeSummary | None:
    rates = [d.tok_s for d in r.decode]
    if not rates:
        return None
    return DecodeSummary(statistics.median(rates), (max(rates) - min(rates)) / 2, len(rates))


def likely_causes(r: SelfTestResult) -> list[str]:
    t = r.telemetry
    out = []
    hot = [x for x in t.throttle_reasons if x not in ("gpu_idle", "applications_clocks", "none")]
    if hot:
        out.append(f"GPU clocks held down ({', '.join(hot)})")
    if t.pcie_below_max:
        out.append(f"PCIe link below its maximum ({t.pcie})")
    if t.churn_per_s is not None and t.churn_per_s > 2000:  # healthy freq <= ~800/s; the trap ~4800/s (alerts.py)
        out.append(f"pool churn {t.churn_per_s:.0f} slots/s (the card's trap saturates PCIe)")
    return out


def verdict(r: SelfTestResult) -> str:
    s = decode_summary(r)
    card = r.card_decode_tok_s
    if s is None:
        return "no decode run finished"
    if card is None:
        return f"{s.median:.1f} tok/s (the card has no figure for this profile)"
    gap = s.median - card
    if abs(gap) <= CARD_TOLERANCE_TOK_S:
        return f"as the card: within its ±{CARD_TOLERANCE_TOK_S:g} tok/s"
    if gap > 0:
        return f"{gap:.1f} tok/s above the card (a faster card than the RTX PRO 6000, or a different image)"
    causes = likely_causes(r)
    why = "; likely cause: " + "; ".join(causes) if causes else (
        "; nothing in the telemetry explains it: check ECC, other GPU processes, and the engine image")
    return f"{-gap:.1f} tok/s ({-gap / card:.0%}) below the card{why}"


def card_line(r: SelfTestResult) -> str:
    """'card 48.9 · this box 48.6 ± 0.2, 3 runs, 2026-12-01' (the issue's wording)."""
    s = decode_summary(r)
    card = f"card {r.card_decode_tok_s:g}" if r.card_decode_tok_s is not None else "card —"
    if s is None:
        return f"{card} · this box: no result"
    box = "SIMULATED box" if r.simulated else "this box"
    spread = f" ± {s.spread:.1f}" if s.runs > 1 else ""  # one run has no spread to show (issue 49: "± 0.0, 1 run")
    return f"{card} · {box} {s.median:.1f}{spread}, {s.runs} run{'s' if s.runs != 1 else ''}, {r.date[:10]}"


@dataclass(frozen=True)
class Standing:
    """What the Profiles cards and the Self-test tab show for a profile: the card line, the verdict, and
    why the stored result no longer describes this box's setup ('' while it does)."""

    profile_id: str
    line: str  # "card 48.9 · this box 48.6 ± 0.2, 3 runs, 2026-12-01"
    verdict: str
    stale: str
    date: str


def stale_reason(result: SelfTestResult, image_id: str, recipe_hash: str) -> str:
    """Why a stored result no longer describes this box's setup ('' when it still does)."""
    why = []
    if image_id and result.image_id and image_id != result.image_id:
        why.append(f"the engine image changed ({result.image_id[:19]} → {image_id[:19]})")
    if recipe_hash and result.recipe_hash != recipe_hash:
        why.append("the profile's command changed since")
    return "; ".join(why)


def standing_of(r: SelfTestResult, image_id: str, recipe_hash: str) -> Standing:
    return Standing(r.profile_id, card_line(r), verdict(r), stale_reason(r, image_id, recipe_hash), r.date)


def needle_lines(r: SelfTestResult) -> list[str]:
    by_len: dict[int, list[NeedleOutcome]] = {}
    for n in r.needles:
        by_len.setdefault(n.length, []).append(n)
    out = []
    for length, items in sorted(by_len.items()):
        ran = [n for n in items if not n.skipped]
        label = f"{length // 1024}K" if length % 1024 == 0 else str(length)
        if not ran:
            out.append(f"{label}: not run ({items[0].skipped})")
            continue
        hits = sum(n.found for n in ran)
        depths = ", ".join(f"{n.depth:g} {'✓' if n.found else '✗'}" for n in ran)
        out.append(f"{label}: {hits}/{len(ran)} depths ({depths})")
    return out


def to_markdown(r: SelfTestResult) -> str:
    s = decode_summary(r)
    t = r.telemetry
    lines = [f"# Self-test: profile {r.profile_id}" + (" (SIMULATED engine)" if r.simulated else ""), "",
             f"- date: {r.date}", *([f"- GPU: {r.gpu} (one engine per GPU; the others kept serving)"]
                                    if r.gpu is not None else []),
             f"- engine image: `{r.image_id}`", f"- recipe hash: `{r.recipe_hash}`",
             f"- wall time: {r.wall_s:.0f} s", "", "## Decode (single stream, the card's sampling)", "",
             f"**{card_line(r)}** — {verdict(r)}", ""]
    if s is not None:
        lines += ["| run | tok/s | tokens | TTFT s | /metrics tok/s |", "|---|---|---|---|---|"]
        for i, d in enumerate(r.decode, 1):
            m = f"{d.metrics_tok_s:.1f}" if d.metrics_tok_s is not None else "—"
            lines.append(f"| {i} | {d.tok_s:.2f} | {d.tokens} | {d.ttft_s:.2f} | {m} |")
        lines.append("")
    if r.ttft:
        lines += ["## Prefill / time to first token", "", "| prompt tokens | TTFT s | prefill tok/s |", "|---|---|---|"]
        lines += [f"| {p.prompt_tokens} | {p.ttft_s:.2f} | {p.prefill_tok_s:.0f} |" for p in r.ttft]
        lines.append("")
    if r.needles:
        lines += ["## Needle in a haystack (depths 0.05 / 0.50 / 0.95, tokens via /tokenize)", ""]
        lines += [f"- {x}" for x in needle_lines(r)]
        lines.append("")
    lines += ["## During the run", "",
              f"- VRAM peak: {_num(t.vram_peak_gib, ' GiB')} of {_num(t.vram_total_gib, ' GiB')}",
              f"- SM clock: {_num(t.sm_clock_min_mhz, '')}–{_num(t.sm_clock_max_mhz, ' MHz')}",
              f"- throttle reasons: {', '.join(t.throttle_reasons) or 'none seen'}",
              f"- PCIe link: {t.pcie or 'unknown'}",
              f"- FP4 pool coverage: {_num(t.coverage_pct, '%')}, churn {_num(t.churn_per_s, ' slots/s')}"]
    if t.gpu_note:
        lines.append(f"- GPU: {t.gpu_note}")
    return "\n".join(lines) + "\n"


def to_json_text(r: SelfTestResult) -> str:
    d = r.to_json()
    d["summary"] = {"card_line": card_line(r), "verdict": verdict(r), "needles": needle_lines(r)}
    return json.dumps(d, indent=2)


def _num(v: float | int | None, unit: str) -> str:
    if v is None:
        return "—"
    return f"{v:.1f}{unit}" if isinstance(v, float) else f"{v}{unit}"
