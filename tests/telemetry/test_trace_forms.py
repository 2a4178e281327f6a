"""The one pool-trace parser reads the log forms of both builds (pinned de4af53 and main d358bad) and says
when a build's pool lines are of a form it cannot read (issue 45; docs/engine.md "Upgrading the engine")."""

from __future__ import annotations

from pathlib import Path

from app.backend.engine.logs.bootlog import BootTracker
from app.backend.engine.logs.loglines import pool_sizing, unknown_pool_form
from app.backend.telemetry.trace import parse_text

from .conftest import ALL_LOGS, log_text

MAIN = Path(__file__).parent / "fixtures" / "engine-logs-main"


def _main(name: str) -> str:
    return (MAIN / name).read_text(encoding="utf-8")


def test_pinned_build_logs_are_all_understood() -> None:
    for name in ALL_LOGS:
        assert parse_text(log_text(name), year=2026).snapshot().understood, name


def test_main_gate_fire_and_audit_forms_counted_apart() -> None:
    snap = parse_text(_main("main_gate_audit.log"), year=2026).snapshot()
    assert (snap.gate_fires, snap.gate_audits) == (2, 1)
    assert snap.coverage_pct == 44.2 and snap.summaries == 2
    assert snap.sizing is not None and snap.sizing.slots == 469
    assert snap.understood  # the new INFO/ERROR lines of the V2 runner are not pool lines: nothing unknown


def test_main_exl3_need_pool_lines_keep_the_delta_tier_sizing() -> None:
    snap = parse_text(_main("main_exl3_needpool.log"), year=2026).snapshot()
    assert snap.sizing is not None and (snap.sizing.slots, snap.sizing.slot_mib) == (1024, 0.4)
    assert snap.coverage_pct == 22.5 and snap.understood and not snap.pool_disabled


def test_main_exl3_need_pool_staging_alone_gives_the_slot_size() -> None:
    line = _main("main_exl3_needpool.log").splitlines()[0]
    ps = pool_sizing(line.split("] ", 1)[1])
    assert ps is not None and (ps.slots, ps.slot_mib) == (None, 0.43)


def test_main_exl3_line_without_the_fp4_pool_means_pool_absent() -> None:
    snap = parse_text(_main("main_exl3_nopool.log"), year=2026).snapshot()
    assert snap.pool_disabled and snap.understood and snap.coverage_pct is None


def test_unknown_forms_are_said_never_guessed() -> None:
    text = _main("future_unknown_forms.log")
    snap = parse_text(text, year=2026).snapshot()
    assert snap.coverage_pct is None and snap.sizing is None and snap.summaries == 0
    assert not snap.understood and snap.unknown_form is not None and "tier v3" in snap.unknown_form
    assert unknown_pool_form(text.splitlines()[0].split("] ", 1)[1])


def test_an_unknown_summary_alone_is_said() -> None:
    line = _main("future_unknown_forms.log").splitlines()[1]
    snap = parse_text(line + "\n", year=2026).snapshot()
    assert snap.unknown_form is not None and "tick 64 (FP4 pool)" in snap.unknown_form


def test_one_garbled_summary_among_read_ones_does_not_flip_the_verdict() -> None:
    text = log_text("freq_trace1_every64_469slots_top8.log") + "INFO 08-22 14:03:11 [moe_w2_delta.py:1867] [delta] tick 9: 4\n"
    snap = parse_text(text, year=2026).snapshot()
    assert snap.understood and snap.coverage_pct == 46.5


def test_boot_tracker_reads_the_main_pool_less_line() -> None:
    t = BootTracker()
    for line in _main("main_exl3_nopool.log").splitlines():
        t.feed(line)
    assert t.progress.pool is not None and t.progress.pool.disabled
