"""The SIMULATED engine's self-test support: /tokenize, min_tokens, needles, profile quality, slow-down."""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from app.backend.simengine.quality import DECOHERENCE, MISSED_ANSWER
from tests.simengine.conftest import poll


def post(url: str, body: dict[str, Any], timeout: float = 60) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def chat(base: str, content: str, **extra: Any) -> dict[str, Any]:
    body = {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": content}], **extra}
    return post(base + "/v1/chat/completions", body)


def test_tokenize_counts_what_the_chat_request_is_charged(make_sim) -> None:
    sim = make_sim()
    msgs = [{"role": "user", "content": "one two three four five six seven eight nine ten"}]
    tok = post(sim.base_url + "/tokenize", {"model": "deepseek-v4-flash", "messages": msgs})
    assert tok["max_model_len"] == sim.config.max_model_len
    assert len(tok["tokens"]) == tok["count"]
    out = post(sim.base_url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 4})
    assert out["usage"]["prompt_tokens"] == tok["count"]
    plain = post(sim.base_url + "/tokenize", {"prompt": "one two three"})
    assert plain["count"] == 4  # round(3 * 1.3)


def test_min_tokens_holds_eos_back(make_sim) -> None:
    sim = make_sim(decode_tok_s=3000.0)
    base = chat(sim.base_url, "hello", chat_template_kwargs={"thinking": False})
    natural = base["usage"]["completion_tokens"]
    longer = chat(sim.base_url, "hello", min_tokens=natural + 50, chat_template_kwargs={"thinking": False})
    assert longer["usage"]["completion_tokens"] == natural + 50
    assert longer["choices"][0]["finish_reason"] == "stop"
    exact = chat(sim.base_url, "hello", max_tokens=700, min_tokens=700, ignore_eos=True)
    assert exact["usage"]["completion_tokens"] == 700 and exact["choices"][0]["finish_reason"] == "length"


def test_needle_found_within_validated_context_missed_past_it(make_sim) -> None:
    sim = make_sim(env={"MOET_SIM_NEEDLE_MAX_TOKENS": "200"})
    needle = "filler words here. The secret code for the vault is NDL-7F3A9C. more filler."
    short = chat(sim.base_url, needle + " What is the secret code?", max_tokens=8)
    assert short["choices"][0]["message"]["content"].startswith("NDL-7F3A9C")
    long_text = "stone " * 300 + needle
    missed = chat(sim.base_url, long_text + " What is the secret code?", max_tokens=16)
    content = missed["choices"][0]["message"]["content"]
    assert "NDL-7F3A9C" not in content and content.startswith(MISSED_ANSWER.split()[0])


def test_profile_quality_changes_answers_deterministically(make_sim) -> None:
    q1 = make_sim(decode_tok_s=4000.0)
    q3 = make_sim(decode_tok_s=4000.0, env={"VLLM_MOE_W2_DELTA_POLICY": "need"})
    again = make_sim(decode_tok_s=4000.0, env={"VLLM_MOE_W2_DELTA_POLICY": "need"})
    prompts = [f"write a lock-free queue, variant {i}" for i in range(6)]
    a = [chat(q1.base_url, p, seed=42)["choices"][0]["message"]["content"] for p in prompts]
    b = [chat(q3.base_url, p, seed=42)["choices"][0]["message"]["content"] for p in prompts]
    c = [chat(again.base_url, p, seed=42)["choices"][0]["message"]["content"] for p in prompts]
    assert b == c  # deterministic per profile
    broken = [x for x in b if x.rstrip().endswith(DECOHERENCE)]
    assert len(broken) >= 4 and not any(x.rstrip().endswith(DECOHERENCE) for x in a)
    assert sum(len(x) for x in b) < sum(len(x) for x in a)


def test_degraded_mode_slows_decode_and_says_simulated(make_sim) -> None:
    sim = make_sim(decode_tok_s=200.0, env={"MOET_SIM_DEGRADE": "0.5", "MOET_SIM_DEGRADE_AFTER_S": "0"})
    poll(lambda: any("SIMULATED degraded mode" in ln for ln in sim.captured), 5)
    t0 = time.monotonic()
    out = chat(sim.base_url, "x", max_tokens=60, ignore_eos=True)
    rate = (out["usage"]["completion_tokens"] - 1) / (time.monotonic() - t0)
    assert 70 < rate < 130, rate  # 100 tok/s nominal after the slow-down, far from 200
