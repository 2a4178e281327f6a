"""Issue 49, numbers and words from a new user's walk: sizes in the unit that reads, plurals, N/A once, no spread
for one run, an A/B interval kept to its scale, a whole-number axis for counts, and one switch count for every
process on the data dir."""

from __future__ import annotations

import json
from pathlib import Path

from app.backend.abtest.stats import Pair, summarise
from app.backend.contracts import count_text, size_pair_text, size_text
from app.backend.engine.supervision.history import SupervisionStore
from app.backend.engine.control.supervisor import switch_counts
from app.backend.selftest.report import card_line
from app.backend.selftest.types import DecodeRun, SelfTestResult


def test_sizes_read_in_their_own_unit_and_pairs_in_the_totals() -> None:
    assert size_text(14 * 2**20) == "14.0 MiB" and size_text(1.25 * 2**30) == "1.25 GiB" and size_text(512) == "512 B"
    assert size_pair_text(0, 14 * 2**20) == "0 / 14.0 MiB"  # not "0.00 GiB / 0.014 GiB"
    assert size_pair_text(3.2 * 2**20, 14 * 2**20) == "3.20 / 14.0 MiB"
    assert size_pair_text(2**29, 2**31) == "0.50 / 2.00 GiB"


def test_counts_have_their_plural() -> None:
    assert count_text(1, "artifact") == "1 artifact" and count_text(3, "artifact") == "3 artifacts"
    assert count_text(0, "run") == "0 runs"


def test_n_a_once_for_a_pair_that_is_not_known() -> None:
    from app.ui.telemetry import _pair

    assert _pair(None, None, unit=" s") == "N/A"  # not "N/A/N/A"
    assert _pair(0.021, 0.045, unit=" s") == "0.021/0.045 s"
    assert _pair(0.021, None, unit=" s") == "0.021/N/A s"


def _result(*rates: float) -> SelfTestResult:
    return SelfTestResult("quality", "img", "h", "2026-12-07T00:00:00", True, 48.9, {},
                          decode=[DecodeRun(r, 2000, 0.2, None) for r in rates])


def test_one_run_shows_no_spread() -> None:
    assert card_line(_result(75.0)) == "card 48.9 · SIMULATED box 75.0, 1 run, 2026-12-07"  # not "75.0 ± 0.0, 1 run"
    assert card_line(_result(74.0, 76.0, 75.0)) == "card 48.9 · SIMULATED box 75.0 ± 1.0, 3 runs, 2026-12-07"


def test_an_ab_interval_stays_on_its_scale() -> None:
    """Two seeds (df = 1, t = 6.31): the t interval of picks reached [−2.66, +3.66] on a −1…+1 scale."""
    picks = [Pair("p1", 1, 1.0), Pair("p2", 1, 1.0), Pair("p1", 2, -1.0), Pair("p2", 2, 1.0)]
    s = summarise(picks, bound=1.0).seed_blocked
    assert s.low == -1.0 and s.high == 1.0 and s.clamped
    assert "90% CI [-1.00, +1.00] (n = 2, cut to the scale's ±1)" in s.text()
    narrow = summarise([Pair("p1", 1, 0.5), Pair("p1", 2, 0.6), Pair("p1", 3, 0.55)], bound=1.0).seed_blocked
    assert not narrow.clamped and "cut" not in narrow.text()


def test_the_requests_plot_counts_in_whole_numbers() -> None:
    import html
    import re

    from app.backend.telemetry.plotdata import PLOTS
    from app.ui.telemetry import plots_html

    page = plots_html(PLOTS)
    metas = {m: json.loads(html.unescape(raw)) for m, raw in re.findall(r'id="telemetry-plot-(\w+)" data-plot="([^"]*)"',
                                                                        page)}
    assert metas["requests"]["integer"] is True and metas["speed"]["integer"] is False
    js = (Path(__file__).resolve().parents[1] / "assets" / "js" / "telemetry-plots.js").read_text()
    assert "meta.integer ? { ticker: wholeTicks }" in js


def test_switches_are_counted_in_the_data_dir_for_every_process(tmp_path: Path) -> None:
    """The panel's switches and a CLI's read the same file: `engine status --json` and the Service tab agree."""
    panel, cli = SupervisionStore(tmp_path), SupervisionStore(tmp_path)
    for result in ("ok", "ok", "rolled_back", "ok"):
        panel.switched(result)
    seen = switch_counts(cli.read())
    assert (seen.switches_ok, seen.switches_rolled_back, seen.switches_failed, seen.switches_cancelled) == (3, 1, 0, 0)
