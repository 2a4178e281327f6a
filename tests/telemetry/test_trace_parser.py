"""The trace parser on every engine-log fixture (exact values of known lines) and on edge cases."""

from __future__ import annotations

import random

import pytest

from app.backend.alerts.rules import AlertInputs, churn_trap, pool_absent, zero_coverage
from app.backend.telemetry.trace import TraceParser, parse_text

from .conftest import ALL_LOGS, log_text

PREFIX = "INFO 08-22 14:03:11 [moe_w2_delta.py:1867] "


def _parse(name: str) -> tuple[TraceParser, dict]:
    p = TraceParser(year=2026)
    seen: dict = {}
    p.on_summary = lambda rank, s: seen.setdefault(rank, []).append(s)
    p.feed(log_text(name))
    p.flush()
    return p, seen


@pytest.mark.parametrize("name", ALL_LOGS)
def test_every_fixture_parses_with_counts_and_invariant(name: str) -> None:
    text = log_text(name)
    p, seen = _parse(name)
    assert p.lines == len(text.splitlines())
    assert p.summaries == text.count("] tick ")  # every summary line recognised, none invented
    for rank, sums in seen.items():
        for s in sums:
            # the summary format (docs/simengine.md): filled slots = cached = cumulative promoted − cumulative evicted
            assert s.cached == s.cum_promoted - s.cum_evicted, (rank, s)
            assert s.cached == s.covered and 0 <= s.hit_tokens_pct <= 100
            assert s.ts is not None
        ticks = [s.tick for s in sums]
        assert ticks == sorted(ticks)


def test_freq_trace1_final_summary_exact() -> None:
    p, seen = _parse("freq_trace1_every64_469slots_top8.log")
    snap = p.snapshot()
    last = snap.primary.last
    assert (last.tag, last.tick, last.cached, last.slots, last.covered, last.total) == ("delta", 3968, 469, 469, 469, 11008)
    assert (last.covered_pct, last.hit_tokens_pct, last.hit_experts_pct) == (4.3, 46.5, 46.5)
    assert (last.win_promoted, last.win_evicted, last.cum_promoted, last.cum_evicted) == (512, 512, 31600, 31131)
    assert snap.coverage_pct == 46.5 and snap.summaries == 62
    assert snap.sizing.slots == 469 and snap.sizing.slot_mib == 0.1
    assert p.trace_on is True and p.rank_states()["main"].trace_every == 64
    # histogram of the last summary: 43 layers, counts sum to the filled slots
    per_layer = p.rank_states()["main"].per_layer
    assert len(per_layer) == 43 and sum(per_layer.values()) == 469


def test_tp2_ranks_kept_apart() -> None:
    p, seen = _parse("tp2_two_ranks_freq_trace1_every64_938slots.log")
    snap = p.snapshot()
    assert [r.key for r in snap.ranks] == ["Worker_TP0", "Worker_TP1"]
    tp0, tp1 = snap.ranks
    assert tp0.summaries == tp1.summaries == 23
    assert tp0.last.hit_tokens_pct == 59.2 and tp1.last.hit_tokens_pct == 59.3
    assert tp0.last.tick == tp1.last.tick == 1472
    assert (tp1.last.cached, tp1.last.slots, tp1.last.cum_promoted, tp1.last.cum_evicted) == (938, 938, 11696, 10758)
    assert snap.coverage_pct == 59.25  # mean over ranks
    # histograms differ per rank (L10:22 on TP0, L10:21 on TP1 in the last pair)
    st = p.rank_states()
    assert st["Worker_TP0"].per_layer[10] == 22 and st["Worker_TP1"].per_layer[10] == 21
    assert st["Worker_TP0"].dump_failures + st["Worker_TP1"].dump_failures == log_text(
        "tp2_two_ranks_freq_trace1_every64_938slots.log").count("delta dump to ")


def test_proc_prefix_enginecore() -> None:
    p, _ = _parse("freq_trace1_every64_procprefix_enginecore.log")
    snap = p.snapshot()
    assert [r.key for r in snap.ranks] == ["EngineCore_DP0"]
    assert snap.primary.last.tick == 1472 and snap.summaries == 23


def test_disabled_auto_zero_slots_is_pool_absent() -> None:
    p, _ = _parse("disabled_auto_0slots_trace1_every64.log")
    snap = p.snapshot()
    assert snap.sizing.disabled and snap.sizing.auto
    assert (snap.sizing.free_after_kv_gib, snap.sizing.reserve_gib) == (2.37, 3.0)
    assert snap.primary.last.slots == 0 and snap.primary.last.total == 256
    assert snap.pool_disabled
    alert = pool_absent(AlertInputs(trace=snap))
    assert alert is not None and alert.severity == "critical" and "4.96/30" in alert.meaning
    assert "2.37 GiB" in alert.meaning


def test_empty_log_gb0() -> None:
    p, _ = _parse("disabled_gb0_trace1_every64.log")
    snap = p.snapshot()
    assert snap.lines == 0 and snap.ranks == () and snap.coverage_pct is None and snap.sizing is None
    assert not snap.pool_disabled  # nothing known: no pool line at all (trace-off/absent is the hub's call)


@pytest.mark.parametrize(
    "name,slots,mib,gib,auto,trace",
    [
        ("boot_auto_sized_trace1.log", 520, 12.0, 6.09, True, True),
        ("boot_tp1_5.5gib_packstore_trace1_nodump.log", 469, 12.0, 5.5, False, True),
        ("boot_tp1_default2gib_notrace.log", 170, 12.0, 1.99, False, None),
        ("boot_tp4_rank_4.5gib_trace2_dump.log", 1536, 3.0, 4.5, False, True),
    ],
)
def test_boot_sizing_lines(name, slots, mib, gib, auto, trace) -> None:
    p, _ = _parse(name)
    sz = p.snapshot().sizing
    assert (sz.slots, sz.slot_mib, sz.pool_gib, sz.auto, sz.deferred) == (slots, mib, gib, auto, False)
    assert p.trace_on is trace and p.summaries == 0
    if name.startswith("boot_auto"):
        assert (sz.free_after_kv_gib, sz.reserve_gib) == (9.1, 3.0)


def test_hysteresis_low_churn_vs_churn_flat_high_churn() -> None:
    hyst = _parse("freq_hyst8_trace1_every64_469slots_top8_mtp1.log")[0].snapshot()
    flat = _parse("churn_flat_24slots_trace1_every64_top8.log")[0].snapshot()
    assert hyst.primary.last.win_promoted == 0 and hyst.primary.promotions_per_s == 0.0
    assert hyst.primary.last.cum_promoted == 473 and hyst.primary.last.cum_evicted == 4
    assert flat.primary.replacements_per_s > 200  # ~511 swaps per 64 ticks, ~1.6 s apart
    assert flat.primary.replacements_per_s / flat.primary.last.slots > 2.5
    assert churn_trap(AlertInputs(trace=hyst)) is None
    trap = churn_trap(AlertInputs(trace=flat))
    assert trap is not None and "1536" in trap.meaning and trap.id == "churn_trap"


def test_need_nogate_zero_coverage_alert() -> None:
    snap = _parse("need_nogate_trace1_every64_469slots_top8.log")[0].snapshot()
    assert snap.primary.last.cached == 0 and snap.summaries == 6 and not snap.pool_disabled
    a = zero_coverage(AlertInputs(trace=snap))
    assert a is not None and a.severity == "critical" and "4.96/30" in a.meaning
    assert zero_coverage(AlertInputs(trace=snap, policy="need")).severity == "warning"


def test_need_gate_lines_and_force_promote() -> None:
    p, _ = _parse("need_gate_trace2_every25_gatetrace_469slots_top8.log")
    snap = p.snapshot()
    assert snap.force_promoted == 3520 and snap.gate_fires == 55  # README: 55 fires, 3520 gate promotions
    assert snap.need == (23, 53, 67, 22, 51, 64, 5394, 11264)
    st = p.rank_states()["main"]
    assert st.evict_lines == 3051 and st.promote_lines == 0
    p1 = _parse("need_gate_trace1_every64_469slots_top8.log")[0].snapshot()
    assert p1.need == (16, 45, 59, 22, 50, 63, 11007, 11264)


def test_trace2_event_lines_counted() -> None:
    p, _ = _parse("freq_trace2_every25_469slots_top8.log")
    st = p.rank_states()["main"]
    assert (st.promote_lines, st.evict_lines) == (3984, 3515)
    assert st.last.cum_promoted == 3984  # every lazy promotion printed a line


def test_packstore_lines() -> None:
    st = _parse("packstore_ensure_promote16_trace1_every64_coldboot.log")[0].rank_states()["main"]
    assert (st.pack_reads, st.pack_gib) == (47907, 4.39)
    warm = _parse("packstore_ensure_promote16_trace2_every64_warmboot.log")[0].rank_states()["main"]
    # prefill-ensure promotions count in the window but print no promote line (fixture README)
    assert warm.last.cum_promoted == 2485 and warm.promote_lines == 2368 and warm.promote_lines < warm.last.cum_promoted


# --- synthetic edge cases ---------------------------------------------------------------------------

SUM = ("[delta] tick {t}: {c}/469 slots, covering {c}/11008 experts (4.3%); hit-rate {h}% tokens / 12.9% experts; "
       "window +{p}/-{e}, cumulative +{cp}/-{ce}")


def test_chunked_feeding_equals_whole_file() -> None:
    text = log_text("tp2_two_ranks_freq_trace1_every64_938slots.log")
    whole = parse_text(text, year=2026).snapshot()
    rng = random.Random(5)
    p = TraceParser(year=2026)
    i = 0
    while i < len(text):
        n = rng.randint(1, 300)
        p.feed(text[i : i + n])
        i += n
    p.flush()
    assert p.snapshot() == whole


def test_truncated_summary_is_ignored_then_recovers() -> None:
    p = TraceParser()
    full = PREFIX + SUM.format(t=64, c=469, h=41.7, p=16, e=16, cp=3024, ce=2555)
    p.feed_line(full[:90])  # cut mid-line (e.g. container log rotation)
    assert p.summaries == 0 and p.snapshot().coverage_pct is None
    p.feed_line(full)
    assert p.summaries == 1 and p.snapshot().coverage_pct == 41.7


def test_old_fp4_format() -> None:
    p = TraceParser()
    p.feed_line(PREFIX + "[delta] tick 192: FP4 120/469 slots, covering 120/11008 experts (1.1%); hit-rate 6.3% tokens"
                " / 2.1% experts; window +120/-0, cumulative +120/-0")
    p.feed_line("INFO 08-22 14:03:11 [moe_w2_delta.py:1876] [delta] FP4 experts per layer: L0:14 L1:9 L42:19")
    last = p.snapshot().primary.last
    assert last.old_format and (last.cached, last.slots, last.hit_tokens_pct) == (120, 469, 6.3)
    assert p.rank_states()["main"].per_layer == {0: 14, 1: 9, 42: 19}


def test_ansi_colours_and_proc_prefix() -> None:
    p = TraceParser()
    line = ("(EngineCore_DP0 pid=412) \x1b[32mINFO\x1b[0m 08-22 14:03:11 \x1b[90m[moe_w2_delta.py:1867]\x1b[0m "
            + SUM.format(t=4160, c=469, h=41.7, p=16, e=16, cp=3024, ce=2555))
    p.feed_line(line)
    snap = p.snapshot()
    assert snap.ranks[0].key == "EngineCore_DP0" and snap.coverage_pct == 41.7


def test_interleaved_ranks_rates_per_rank() -> None:
    p = TraceParser()
    for i, t in enumerate(range(64, 64 * 6, 64)):
        for rank, win in (("Worker_TP0", 10), ("Worker_TP1", 40)):
            body = SUM.format(t=t, c=469, h=50.0, p=win, e=win, cp=469 + win * (i + 1), ce=win * (i + 1))
            p.feed_line(f"({rank} pid=1{rank[-1]}) " + PREFIX + body, ts=1000.0 + i)
    views = {r.key: r for r in p.snapshot().ranks}
    assert views["Worker_TP0"].promotions_per_s == pytest.approx(10.0)
    assert views["Worker_TP1"].promotions_per_s == pytest.approx(40.0)


def test_h2d_from_boot_slot_size() -> None:
    p = TraceParser()
    p.feed_line("INFO 08-22 14:03:00 [moe_w2_delta.py:428] moe_w2 delta tier: 469 slots x 12.0 MiB (5.50 GiB pool)")
    for i in range(4):
        p.feed_line(PREFIX + SUM.format(t=64 * (i + 1), c=469, h=50.0, p=100, e=100, cp=469 + 100 * i, ce=100 * i),
                    ts=2000.0 + i)
    r = p.snapshot().primary
    assert r.promotions_per_s == pytest.approx(100.0)
    assert r.h2d_gib_s == pytest.approx(100 * 12 / 1024)  # promotions/s × 12 MiB


def test_idle_engine_no_ticks_and_garbage() -> None:
    p = TraceParser()
    p.feed("INFO 08-22 14:03:00 [moe_w2_delta.py:428] moe_w2 delta tier: 469 slots x 12.0 MiB (5.50 GiB pool)\n")
    p.feed("(APIServer pid=1) INFO:     127.0.0.1:5555 - \"GET /health HTTP/1.1\" 200 OK\n")
    p.feed("\x00\xff garbage ] [ ) ( tick tick: 1/2\n[delta] tick x\n(((\n\n[delta]\nINFO \n")
    p.feed("INFO 08-22 14:03:11 [x.py:1] [delta] tick 5: 1/2 slots, covering oops\n")
    snap = p.snapshot()
    assert snap.summaries == 0 and snap.coverage_pct is None and snap.sizing.slots == 469
    assert zero_coverage(AlertInputs(trace=snap)) is None and churn_trap(AlertInputs(trace=snap)) is None


def test_summary_without_prefix_still_parsed() -> None:
    # the bare message (e.g. a log shipper that strips vLLM's prefix)
    p = TraceParser()
    p.feed_line(SUM.format(t=64, c=10, h=3.0, p=10, e=0, cp=10, ce=0))
    assert p.snapshot().primary.last.cached == 10


def test_docker_timestamps_and_unknown_prefix() -> None:
    p = TraceParser()
    body = SUM.format(t=64, c=469, h=41.7, p=16, e=16, cp=3024, ce=2555)
    p.feed_line("2026-11-30T03:34:11.123456789Z (Worker_TP1 pid=7) " + PREFIX + body)  # docker logs -t
    p.feed_line("myhost vllm[12]: INFO 08-22 14:03:11 [moe_w2_delta.py:428] moe_w2 delta tier: 469 slots x 12.0 MiB"
                " (5.50 GiB pool)")  # a shipper's own prefix
    snap = p.snapshot()
    assert [r.key for r in snap.ranks] == ["Worker_TP1", "main"]
    assert snap.ranks[0].last.hit_tokens_pct == 41.7 and snap.sizing.slots == 469
