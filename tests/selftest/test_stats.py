"""The A/B statistics against hand-computed examples (docs/selftest.md)."""

from __future__ import annotations

import math

import pytest

from app.backend.abtest.stats import Pair, seed_means, summarise, t95, t_interval


def test_seed_blocked_interval_matches_hand_computation() -> None:
    # Three seeds, two prompts each. Per-seed means of d = B - A: seed 1: (-2 + 0)/2 = -1,
    # seed 2: (-3 + -1)/2 = -2, seed 3: (1 + -1)/2 = 0. Mean -1, sd 1, SE 1/sqrt(3) = 0.57735,
    # t(2, 0.95) = 2.919986 -> half width 1.685854 -> [-2.6859, 0.6859].
    pairs = [Pair("p1", 1, -2), Pair("p2", 1, 0), Pair("p1", 2, -3), Pair("p2", 2, -1),
             Pair("p1", 3, 1), Pair("p2", 3, -1)]
    assert seed_means(pairs) == {1: -1.0, 2: -2.0, 3: 0.0}
    s = summarise(pairs)
    assert s.seed_blocked.n == 3
    assert s.seed_blocked.mean == pytest.approx(-1.0)
    assert s.seed_blocked.low == pytest.approx(-2.685854, abs=1e-5)
    assert s.seed_blocked.high == pytest.approx(0.685854, abs=1e-5)
    assert s.verdict == "no decisive difference"
    # pooled over 6 cells: mean -1, squared deviations 1+1+4+0+4+0 = 10, sd sqrt(10/5) = 1.414214,
    # SE 0.577350, t(5) = 2.015048 -> half 1.163388
    assert s.pooled.n == 6
    assert s.pooled.low == pytest.approx(-2.163388, abs=1e-5)
    assert (s.wins, s.ties, s.losses) == (1, 1, 4)


def test_card_study4_shape_reproduces_its_half_width() -> None:
    # The card's seed-blocked CI for profile 2: mean -1.37, [-2.48, -0.26], n = 5 -> half width 1.11,
    # so SE = 1.11 / t(4) = 0.5207 and sd = 1.164. Five seed means with that mean and sd give it back.
    sd = 1.11 / 2.131847 * math.sqrt(5)
    offsets = [o / math.sqrt(1.25) for o in (-1.5, -0.5, 0.0, 0.5, 1.5)]  # squares sum to 5, /4 -> sd 1.0
    means = [-1.37 + o * sd for o in offsets]
    iv = t_interval(means)
    assert iv.low == pytest.approx(-2.48, abs=0.005) and iv.high == pytest.approx(-0.26, abs=0.005)
    assert iv.excludes_zero


def test_one_seed_gives_no_interval_and_says_so() -> None:
    s = summarise([Pair("p1", 42, 1), Pair("p2", 42, 1)])
    assert s.seed_blocked.low is None and s.verdict == "too few seeds"
    assert "no interval" in s.seed_blocked.text()


def test_decisive_when_interval_excludes_zero() -> None:
    pairs = [Pair(f"p{i}", seed, 1.0 + 0.1 * seed) for seed in (1, 2, 3) for i in range(2)]
    assert summarise(pairs).verdict == "B better"


def test_t_quantiles_table_and_expansion() -> None:
    assert t95(1) == pytest.approx(6.313752)
    assert t95(30) == pytest.approx(1.697261)
    assert t95(40) == pytest.approx(1.683851, abs=2e-4)  # table value
    assert t95(120) == pytest.approx(1.657651, abs=1e-4)
    with pytest.raises(ValueError):
        t95(0)


def test_no_pairs_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="grade at least one pair"):
        summarise([])
