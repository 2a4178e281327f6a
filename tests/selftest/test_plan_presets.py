"""The Self-test tab offers a short run up front beside the card's method (issue 42): both presets are valid plans,
and the quick one is estimated far shorter."""

from __future__ import annotations

from app.backend.selftest.runner import plan_steps
from app.ui.selftest import FULL, PRESETS, _plan, preset_values


def test_the_quick_preset_is_a_valid_plan_and_estimated_far_shorter_than_the_full_one() -> None:
    assert len(PRESETS) == 2 and preset_values("no such preset") == PRESETS[FULL]
    quick, full = (_plan("quality", *preset_values(n)) for n in (next(n for n in PRESETS if n != FULL), FULL))
    assert (full.runs, full.decode_tokens, full.needle_lengths) == (3, 2000, (65536, 262144))  # the card's method

    def estimate(plan: object) -> float:  # at the card's quality rate and context, as SelfTestService.estimate_s
        return sum(s.expect_s for s in plan_steps(plan, 49.0, 262144))  # type: ignore[arg-type]

    assert estimate(quick) * 3 < estimate(full)
