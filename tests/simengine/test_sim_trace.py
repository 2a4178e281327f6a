"""Boot lines and `[delta]` trace lines in the engine's exact formats (docs/simengine.md, Log output)."""

from __future__ import annotations

import openai

from app.backend.simengine.config import SimEngineConfig
from app.backend.simengine.delta import DeltaSim, plan_tier
from app.backend.simengine.logsink import LogSink

from .conftest import CARD_ENV, HIST_RE, PREFIX_RE, STORE_RE, TIER_RE, messages, poll, summaries

MSG = [{"role": "user", "content": "hello"}]


def drive(env: dict[str, str], steps: int, seed: int = 3) -> list[str]:
    """Run the tier simulation for `steps` decode steps; returns the log lines."""
    lines: list[str] = []
    cfg = SimEngineConfig(env={**CARD_ENV, **env}, seed=seed)
    sim = DeltaSim(plan_tier(cfg), LogSink(lines.append, 7, 7), seed)
    for _ in range(steps):
        sim.on_step(1)
    return lines


def test_every_line_has_the_vllm_prefix_and_engine_core_process(make_sim):
    sim = make_sim()
    # uvicorn's access lines and the loader's progress bar (tqdm on stderr, no prefix, as in real vLLM:
    # docs/real-engine.md) are the only unprefixed lines
    bars = [ln for ln in sim.captured if ln.startswith("Loading safetensors checkpoint shards: ")]
    assert len(bars) == 1
    lines = [ln for ln in sim.captured if not ln.startswith("INFO:     ") and ln not in bars]
    assert all(PREFIX_RE.match(ln) for ln in lines), [ln for ln in lines if not PREFIX_RE.match(ln)][:3]
    procs = {PREFIX_RE.match(ln).group("proc") for ln in lines}
    assert procs == {"APIServer", "EngineCore_DP0"}
    assert any("SIMULATED" in ln for ln in lines[:3])


def test_boot_sequence_lines(make_sim):
    sim = make_sim(env={"VLLM_MOE_W2_DELTA_TRACE_EVERY": "64"})
    msgs = messages(sim.captured)
    tier = [TIER_RE.match(m) for m in msgs if TIER_RE.match(m)]
    assert [(t["slots"], t["mib"], t["gib"]) for t in tier] == [("597", "12.0", "7.00")]  # floor(7 GiB / 12 MiB)
    assert "moe_w2 delta trace ON: level 1, every 64 ticks" in msgs
    assert sum(m.startswith("moe_w2: layer ") and m.endswith(" planes from cache") for m in msgs) == 43
    assert any(m.startswith("moe_w2 store[delta]: PACK-FILE backend /store/delta.v2.") for m in msgs)
    assert any(m.startswith("moe_w2 LOADER-SKIP armed:") for m in msgs)
    order = ["Model loading took", "Available KV cache memory", "GPU KV cache size", "Graph capturing finished",
             "init engine (profile, create kv cache, warmup model) took", "Starting vLLM API server 0 on http://127.0.0.1:",
             "Available routes are:"]
    idx = [next(i for i, m in enumerate(msgs) if m.startswith(o)) for o in order]
    assert idx == sorted(idx)
    assert sim.captured[-1] == "INFO:     Application startup complete."


def test_ckpt_mismatch_is_a_cache_miss(make_sim):
    sim = make_sim(env={"VLLM_MOE_W2_CKPT_ID": "something-else"})
    msgs = messages(sim.captured)
    assert sum(m.endswith("planes built (1.69 GiB)") for m in msgs) == 43
    assert not any("planes from cache" in m for m in msgs)


def test_ticks_while_generating_satisfy_invariants(make_sim):
    sim = make_sim(decode_tok_s=3000.0, env={"VLLM_MOE_W2_DELTA_TRACE_EVERY": "16"})
    with openai.OpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY", max_retries=0) as c:
        c.completions.create(model="deepseek-v4-flash", prompt="x", max_tokens=300, extra_body={"ignore_eos": True})
    found = summaries(sim.captured)
    assert len(found) >= 300 // 16 - 1
    for m in found:
        assert int(m["cached"]) == int(m["cov"]) == int(m["cum_p"]) - int(m["cum_e"])
        assert int(m["slots"]) == 597 and int(m["total"]) == 11008
        assert int(m["tick"]) % 16 == 0
    ticks = [int(m["tick"]) for m in found]
    assert ticks == sorted(ticks)


def test_idle_engine_prints_no_ticks(make_sim):
    sim = make_sim(env={"VLLM_MOE_W2_DELTA_TRACE_EVERY": "1"})
    before = len(sim.captured)
    poll(lambda: sim.delta.tick == 0 and len(sim.captured) == before, timeout=1)
    assert summaries(sim.captured) == []


def test_freq_pool_saturates_near_card_hit_rate():
    found = summaries(drive({}, 64 * 40))
    late = [float(m["hit_tok"]) for m in found[-10:]]
    assert all(52.0 <= h <= 62.0 for h in late), late
    assert float(found[0]["hit_tok"]) < late[-1]  # warm-up is visibly lower
    lines = drive({}, 128)
    hists = [HIST_RE.match(m) for m in messages(lines) if HIST_RE.match(m)]
    cached = [int(m["cached"]) for m in summaries(lines)]
    assert [sum(int(p.split(":")[1]) for p in h["pairs"].split()) for h in hists] == cached
    assert STORE_RE.match(messages(lines)[2])


def test_hysteresis_damps_churn_compared_to_plain_freq():
    plain = summaries(drive({}, 64 * 20))[5:]
    hyst = summaries(drive({"VLLM_MOE_W2_PROMO_HYST": "8"}, 64 * 20))[5:]
    plain_churn = sum(int(m["win_p"]) for m in plain)
    hyst_churn = sum(int(m["win_p"]) for m in hyst)
    assert plain_churn > 20 * max(1, hyst_churn)
    assert all(int(m["cached"]) == 597 for m in hyst)


def test_need_policy_without_gate_never_promotes():
    lines = drive({"VLLM_MOE_W2_DELTA_POLICY": "need"}, 64 * 5)
    found = summaries(lines)
    assert len(found) == 5
    assert all(m["cached"] == "0" and m["hit_tok"] == "0.0" and m["cum_p"] == "0" for m in found)
    assert not any(HIST_RE.match(m) for m in messages(lines))


def test_trace_off_prints_nothing_and_level2_prints_events():
    assert drive({"VLLM_MOE_W2_DELTA_TRACE": "0"}, 200) == []
    msgs = messages(drive({"VLLM_MOE_W2_DELTA_TRACE": "2", "VLLM_MOE_W2_DELTA_TRACE_EVERY": "25"}, 30))
    assert any(m.startswith("[delta] promote L") for m in msgs)


def test_delta_dump_matches_last_summary(tmp_path):
    import json

    dump = tmp_path / "delta.json"
    lines = drive({"VLLM_MOE_W2_DELTA_DUMP": str(dump)}, 64 * 3)
    last = summaries(lines)[-1]
    doc = json.loads(dump.read_text())
    assert (doc["tick"], doc["cached"], doc["promoted_total"], doc["evicted_total"]) == (
        int(last["tick"]), int(last["cached"]), int(last["cum_p"]), int(last["cum_e"]))
    assert sum(len(v) for v in doc["fp4_by_layer"].values()) == doc["cached"]


def test_trace_is_deterministic_per_seed():
    strip = lambda lines: messages(lines)  # noqa: E731 - timestamps differ, messages must not
    assert strip(drive({}, 64 * 4, seed=11)) == strip(drive({}, 64 * 4, seed=11))
    assert strip(drive({}, 64 * 4, seed=11)) != strip(drive({}, 64 * 4, seed=12))


def test_fail_cache_miss_builds_every_layer(make_sim):
    msgs = messages(make_sim(fail="cache_miss").captured)
    assert sum(m.endswith("planes built (1.69 GiB)") for m in msgs) == 43
    assert not any(m.startswith("moe_w2 LOADER-SKIP armed") for m in msgs)
