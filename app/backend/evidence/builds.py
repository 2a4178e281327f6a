"""Current vs candidate build, side by side, from the runs on this box (docs/engine.md "Upgrading the engine").

Per build: its latest self-test (decode tok/s vs the card, TTFT, needles, VRAM at load, pool coverage), its
boot times and failed boots (recorded by the controller's boot as build evidence), and the latest blind A/B
between the two builds (B − A with its 90 % CI and the number of graded pairs). Read-only; the page and the
CLI render it. Nothing here is invented: a figure no run measured is None and shows as "—".
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from app.backend.abtest.grading import reveal
from app.backend.abtest.journal import Journal
from app.backend.abtest.runner import split_side
from app.backend.engine.builds import store as builds
from app.backend.selftest.store import ResultsStore
from app.backend.selftest.types import SelfTestResult
from app.backend.config.settings import Settings


@dataclass(frozen=True)
class BuildFigures:
    build: builds.Build
    current: bool
    selftest: str = ""  # the self-test the figures come from ("" = none yet)
    decode_tok_s: float | None = None
    card_tok_s: float | None = None
    ttft_s: float | None = None
    needles: str = ""  # "3/3 found"
    vram_gib: float | None = None
    coverage_pct: float | None = None
    boot_s: float | None = None
    failures: tuple[str, ...] = ()  # each failed boot's diagnosis


@dataclass(frozen=True)
class ABFigures:
    run_id: str
    a: str
    b: str
    headline: str  # B − A with its 90 % CI, or why there is none yet
    pairs: int  # graded pairs
    cells: int


@dataclass(frozen=True)
class Comparison:
    current: BuildFigures
    candidate: BuildFigures | None
    ab: ABFigures | None


def _latest_selftest(results: list[SelfTestResult], build_id: str) -> SelfTestResult | None:
    mine = [r for r in results if r.build == build_id]
    return max(mine, key=lambda r: r.date) if mine else None


def figures(b: builds.Build, current: bool, results: list[SelfTestResult]) -> BuildFigures:
    boots = [float(e.summary) for e in b.evidence if e.kind == "boot" and _is_float(e.summary)]
    fails = tuple(e.summary for e in b.evidence if e.kind == "failure")
    r = _latest_selftest(results, b.id)
    if r is None:
        return BuildFigures(b, current, boot_s=boots[-1] if boots else None, failures=fails)
    rates = [d.tok_s for d in r.decode if d.tok_s]
    ttfts = [d.ttft_s for d in r.decode if d.ttft_s]
    ran = [n for n in r.needles if not n.skipped]
    return BuildFigures(
        b, current, selftest=r.date,
        decode_tok_s=round(statistics.fmean(rates), 1) if rates else None, card_tok_s=r.card_decode_tok_s,
        ttft_s=round(statistics.fmean(ttfts), 3) if ttfts else None,
        needles=f"{sum(n.found for n in ran)}/{len(ran)} found" if ran else "",
        vram_gib=r.telemetry.vram_peak_gib, coverage_pct=r.telemetry.coverage_pct,
        boot_s=boots[-1] if boots else None, failures=fails,
    )


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def latest_ab(state_dir: Path, reg: builds.BuildRegistry, x: str, y: str) -> ABFigures | None:
    """The newest A/B whose two sides ran builds x and y (a side without @BUILD ran the current build)."""
    journal = Journal(state_dir)
    cur = reg.current_id()
    for run_id in sorted(journal.runs(), reverse=True):
        try:
            st = journal.load(run_id)
        except (OSError, ValueError, KeyError):
            continue
        sides = {split_side(st.spec.profile_a)[1] or cur, split_side(st.spec.profile_b)[1] or cur}
        if sides != {x, y}:
            continue
        try:
            r = reveal(st)
        except ValueError:  # nothing graded yet
            return ABFigures(run_id, st.spec.profile_a, st.spec.profile_b,
                             f"{st.generated}/{st.total} answers generated; not graded yet (grade it blind on the "
                             "Compare tab)", 0, len(st.spec.cells))
        return ABFigures(run_id, st.spec.profile_a, st.spec.profile_b, r.headline(), r.graded, r.cells)
    return None


def compare(settings: Settings, candidate: str | None = None) -> Comparison:
    """Current vs `candidate` (default: the newest build that is not current)."""
    reg = builds.registry(settings)
    results = ResultsStore(settings.state_dir).all()
    cur = reg.current()
    others = [b for b in reg.all() if b.id != cur.id]
    named = next((b for b in others if b.id == candidate), None)  # a stale pick (promoted meanwhile) falls back
    cand = named or (max(others, key=lambda b: b.built_at) if others else None)
    return Comparison(
        figures(cur, True, results),
        figures(cand, False, results) if cand is not None else None,
        latest_ab(settings.state_dir, reg, cur.id, cand.id) if cand is not None else None,
    )
