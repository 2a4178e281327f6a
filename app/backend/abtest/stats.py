"""Paired statistics of an A/B run, done the way the card's study 4 did them (docs/selftest.md).

Every graded cell is one (prompt, seed) pair: d = score(B) - score(A). A preference grade counts as
+1 (B better), 0 (tie), -1 (A better). The primary estimate is **seed-blocked**: average d within each
seed, then a Student-t interval over the per-seed means (df = seeds - 1). The card: "only extra seeds
add real information" — prompts inside one seed share a generation draw, so treating every cell as
independent (the pooled interval, reported beside it) overstates precision.

The t quantiles are a table (df 1-30, then a Cornish-Fisher expansion), not scipy: scipy is not a
dependency of the panel and this is the only quantile it needs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Literal

# Student t, 0.95 quantile (two-sided 90% interval), df = 1..30 (standard tables).
_T95 = (6.313752, 2.919986, 2.353363, 2.131847, 2.015048, 1.943180, 1.894579, 1.859548, 1.833113, 1.812461,
        1.795885, 1.782288, 1.770933, 1.761310, 1.753050, 1.745884, 1.739607, 1.734064, 1.729133, 1.724718,
        1.720743, 1.717144, 1.713872, 1.710882, 1.708141, 1.705618, 1.703288, 1.701131, 1.699127, 1.697261)
_Z95 = 1.6448536269514722

Verdict = Literal["B better", "A better", "no decisive difference", "too few seeds"]


def t95(df: int) -> float:
    """The 0.95 quantile of Student's t with `df` degrees of freedom.

    Examples:
        >>> round(t95(4), 3)
        2.132
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T95):
        return _T95[df - 1]
    z = _Z95  # Cornish-Fisher: error < 1e-4 for df > 30
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class Pair:
    """One graded cell: the same prompt and seed answered by A and by B."""

    prompt_id: str
    seed: int
    diff: float  # score(B) - score(A); +1/0/-1 for a preference


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float | None  # None when there are too few blocks for an interval
    high: float | None
    n: int  # blocks the interval is over (seeds, or pairs for the pooled one)
    bound: float | None = None  # the scale's edge (±1 for picks, ±10 points): the interval never reaches past it
    clamped: bool = False  # the t interval reached past the scale and was cut to it

    @property
    def excludes_zero(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)

    def text(self, digits: int = 2) -> str:
        if self.low is None or self.high is None:
            return f"{self.mean:+.{digits}f} (n = {self.n}: no interval)"
        cut = f", cut to the scale's ±{self.bound:g}" if self.clamped and self.bound is not None else ""
        return (f"{self.mean:+.{digits}f}, 90% CI [{self.low:+.{digits}f}, {self.high:+.{digits}f}] "
                f"(n = {self.n}{cut})")


@dataclass(frozen=True)
class Summary:
    """The reveal: seed-blocked primary estimate, pooled reference, win/tie/loss from B's side."""

    seed_blocked: Interval
    pooled: Interval
    wins: int  # B better
    ties: int
    losses: int  # A better
    verdict: Verdict


def t_interval(values: list[float], bound: float | None = None) -> Interval:
    """Mean with a two-sided 90% Student-t interval; no interval for fewer than 2 values. `bound`: the values'
    scale is −bound…+bound, and so is the mean's: a wider interval (few seeds, df = 1: t = 6.31) is cut to it
    and says so (issue 49: [−2.66, +3.66] on a −1…+1 scale)."""
    if not values:
        raise ValueError("no values to summarise")
    m = statistics.fmean(values)
    if len(values) < 2:
        return Interval(m, None, None, len(values), bound)
    half = t95(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    low, high = m - half, m + half
    if bound is None or (low >= -bound and high <= bound):
        return Interval(m, low, high, len(values), bound)
    return Interval(m, max(low, -bound), min(high, bound), len(values), bound, clamped=True)


def seed_means(pairs: Iterable[Pair]) -> dict[int, float]:
    by_seed: dict[int, list[float]] = {}
    for p in pairs:
        by_seed.setdefault(p.seed, []).append(p.diff)
    return {s: statistics.fmean(v) for s, v in sorted(by_seed.items())}


def summarise(pairs: list[Pair], bound: float | None = None) -> Summary:
    """Seed-blocked paired mean difference (B - A) with its 90% CI, the pooled one, and win/tie/loss; `bound`: the
    differences' scale (see t_interval)."""
    if not pairs:
        raise ValueError("no graded pairs yet: grade at least one pair before the reveal")
    blocked = t_interval(list(seed_means(pairs).values()), bound)
    pooled = t_interval([p.diff for p in pairs], bound)
    wins = sum(1 for p in pairs if p.diff > 0)
    losses = sum(1 for p in pairs if p.diff < 0)
    if blocked.low is None:
        verdict: Verdict = "too few seeds"
    elif blocked.excludes_zero:
        verdict = "B better" if blocked.mean > 0 else "A better"
    else:
        verdict = "no decisive difference"
    return Summary(blocked, pooled, wins, len(pairs) - wins - losses, losses, verdict)
