"""Decode drift: while a single stream decodes, a live rate below the profile's baseline (this box's
last self-test, else the card's figure) by more than DRIFT_FRACTION for DRIFT_WINDOW_S raises the
`decode_drift` alert (alerts/rules.py names the likely cause). Fed once per telemetry tick.

Why these numbers: the card's decode is reproducible to ±1 tok/s (±2% at 48.9), and /metrics rates
over one tick are noisy by a few percent; 15% for 30 s is far outside both, and the throttling or
slow-link causes it is meant to catch cost more than that (docs/selftest.md, "Drift alert").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from app.backend.recipe.schema import ProfileSpec
    from app.backend.selftest.store import ResultsStore

DRIFT_FRACTION = 0.15
DRIFT_WINDOW_S = 30.0


@dataclass(frozen=True)
class DriftReading:
    profile_id: str
    baseline_tok_s: float
    baseline_source: str  # "self-test 2026-12-01" | "card"
    live_tok_s: float  # median of the window
    below_s: float  # how long it has been below the threshold
    window_s: float = DRIFT_WINDOW_S

    @property
    def drifting(self) -> bool:
        return self.below_s >= self.window_s


class DriftWatch:
    """`baseline_fn(profile_id) -> (tok_s, source) | None`; one instance per telemetry hub."""

    def __init__(self, baseline_fn: Callable[[str], tuple[float, str] | None],
                 fraction: float = DRIFT_FRACTION, window_s: float = DRIFT_WINDOW_S):
        self._baseline_fn = baseline_fn
        self.fraction, self.window_s = fraction, window_s
        self._since: float | None = None
        self._rates: list[float] = []
        self._profile = ""

    def update(self, ts: float, profile_id: str | None, decode_tok_s: float | None,
               running: float | None) -> DriftReading | None:
        """None unless exactly one stream is decoding below the threshold (the state resets otherwise)."""
        if not profile_id or running != 1 or not decode_tok_s or profile_id != self._profile:
            self._since, self._rates, self._profile = None, [], profile_id or ""
            if not profile_id or running != 1 or not decode_tok_s:
                return None
        base = self._baseline_fn(profile_id)
        if base is None or decode_tok_s >= base[0] * (1 - self.fraction):
            self._since, self._rates = None, []
            return None
        if self._since is None:
            self._since = ts
        self._rates = (self._rates + [decode_tok_s])[-120:]
        live = sorted(self._rates)[len(self._rates) // 2]
        return DriftReading(profile_id, base[0], base[1], live, ts - self._since, self.window_s)


def baseline_from(store: ResultsStore, profiles_fn: Callable[[], list[ProfileSpec]]) -> Callable[[str], tuple[float, str] | None]:
    """This box's latest self-test median, else the card's decode figure."""
    import statistics

    def fn(profile_id: str) -> tuple[float, str] | None:
        r = store.latest(profile_id)
        if r is not None and r.decode:
            return statistics.median(d.tok_s for d in r.decode), f"this box's self-test of {r.date[:10]}"
        for p in profiles_fn():
            if p.id == profile_id and p.decode is not None:
                return float(p.decode.value), "the card"
        return None

    return fn
