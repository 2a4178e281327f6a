"""/metrics in vLLM's names, configuration parsing, determinism, the CLI's profile wiring."""

from __future__ import annotations

import argparse

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from app.backend.simengine import SimEngineConfig, config_from_env_and_args
from app.cli.simulate import engine_environment

MSG = [{"role": "user", "content": "Say something about caches."}]


def scrape(base_url: str) -> dict[str, dict[str, float]]:
    """{family name: {sample name + sorted labels: value}}"""
    text = httpx.get(base_url + "/metrics").text
    out: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(fam.name, {})[s.name + str(sorted(s.labels.items()))] = s.value
    return out


def _sample(metrics, family: str, name: str, **labels) -> float:
    base = {"model_name": "deepseek-v4-flash", "engine": "0", **labels}
    return metrics[family][name + str(sorted(base.items()))]


def test_metrics_use_vllm_names_and_counters_increase(sim):
    before = scrape(sim.base_url)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:e2e_request_latency_seconds"):
        assert name in before, name
    with openai.OpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY", max_retries=0) as c:
        resp = c.chat.completions.create(model="deepseek-v4-flash", messages=MSG, max_tokens=20)
    after = scrape(sim.base_url)
    gen = "vllm:generation_tokens"
    assert _sample(after, gen, gen + "_total") - _sample(before, gen, gen + "_total") == 20
    prompt = "vllm:prompt_tokens"
    assert _sample(after, prompt, prompt + "_total") == resp.usage.prompt_tokens
    ok = "vllm:request_success"
    assert _sample(after, ok, ok + "_total", finished_reason="length") == 1
    ttft = "vllm:time_to_first_token_seconds"
    assert _sample(after, ttft, ttft + "_count") == 1
    itl = "vllm:inter_token_latency_seconds"
    assert _sample(after, itl, itl + "_count") == 19
    assert _sample(after, "vllm:num_requests_running", "vllm:num_requests_running") == 0


def test_config_reads_vllm_args_and_env_knobs():
    cfg = config_from_env_and_args(
        ["vllm", "serve", "/models/ds4", "--served-model-name", "ds4", "--max-model-len", "256k", "--port", "8123",
         "--max-num-seqs", "2", "--gpu-memory-utilization", "0.97", "--enable-chunked-prefill"],
        {"MOET_SIM_DECODE_TOK_S": "75", "MOET_SIM_BOOT_S": "2", "MOET_SIM_SEED": "9", "MOET_SIM_FAIL": "cache_miss",
         "VLLM_MOE_W2_PROMO_HYST": "8", "VLLM_MOE_W2_DELTA_GB": "7", "HOME": "/root"},
    )
    assert (cfg.model, cfg.served_name, cfg.max_model_len, cfg.port, cfg.max_num_seqs) == (
        "/models/ds4", "ds4", 262144, 8123, 2)
    assert (cfg.decode_tok_s, cfg.boot_s, cfg.seed, cfg.fail) == (75.0, 2.0, 9, "cache_miss")
    assert cfg.env == {"VLLM_MOE_W2_PROMO_HYST": "8", "VLLM_MOE_W2_DELTA_GB": "7"}
    assert "--gpu-memory-utilization" in cfg.extra_args


def _text(sim, seed_body: dict | None = None) -> str:
    with openai.OpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY", max_retries=0) as c:
        r = c.chat.completions.create(model="deepseek-v4-flash", messages=MSG, max_tokens=60, extra_body=seed_body)
    return (r.choices[0].message.model_extra.get("reasoning") or "") + "|" + (r.choices[0].message.content or "")


def test_same_seed_same_text_other_seed_other_text(make_sim):
    a, b, c = make_sim(seed=5), make_sim(seed=5), make_sim(seed=6)
    assert _text(a) == _text(b)
    assert _text(a) != _text(c)
    assert _text(a, {"seed": 1}) != _text(a, {"seed": 2})  # the request's own seed varies the sample


def test_simulate_cli_uses_profile_env_and_decode_figure(monkeypatch):
    for key in list(__import__("os").environ):
        if key.startswith(("MOET_SIM_", "VLLM_MOE_W2", "MOET_PANEL_RECIPE")):
            monkeypatch.delenv(key)
    args = argparse.Namespace(recipe=None, data_dir="/tmp/moet-sim-test", profile="balanced", decode_tok_s=None,
                              boot_s=None, fail=None, port=18999)
    argv, env = engine_environment(args)
    cfg = config_from_env_and_args(argv, env)
    assert cfg.decode_tok_s == 75.0 and cfg.port == 18999
    assert cfg.env["VLLM_MOE_W2_PROMO_HYST"] == "8" and cfg.env["VLLM_MOE_W2_DELTA_TRACE"] == "1"
    monkeypatch.setenv("MOET_SIM_DECODE_TOK_S", "500")  # the shell wins, like docker run -e
    assert config_from_env_and_args(*engine_environment(args)).decode_tok_s == 500.0


def test_invalid_config_values_are_rejected():
    import pytest

    with pytest.raises(ValueError, match="decode_tok_s"):
        SimEngineConfig(decode_tok_s=0)
    with pytest.raises(ValueError, match="MOET_SIM_DECODE_TOK_S"):
        config_from_env_and_args([], {"MOET_SIM_DECODE_TOK_S": "fast"})
