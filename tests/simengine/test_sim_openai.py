"""The SIMULATED engine as the real `openai` SDK sees it."""

from __future__ import annotations

import httpx
import openai
import pytest

from .conftest import poll

MSG = [{"role": "user", "content": "Explain the FP4 pool in one paragraph."}]


def _collect(stream) -> tuple[str, str, list, list]:
    reasoning, content, finishes, usage_chunks = [], [], [], []
    for chunk in stream:
        if not chunk.choices:
            usage_chunks.append(chunk)
            continue
        delta = chunk.choices[0].delta
        reasoning.append(getattr(delta, "reasoning", None) or "")
        content.append(delta.content or "")
        if chunk.choices[0].finish_reason:
            finishes.append(chunk.choices[0].finish_reason)
    return "".join(reasoning), "".join(content), finishes, usage_chunks


def test_streaming_reasoning_then_content_with_usage_chunk(client, sim):
    stream = client.chat.completions.create(
        model="deepseek-v4-flash", messages=MSG, stream=True, stream_options={"include_usage": True},
        temperature=1.0, top_p=1.0, extra_body={"min_p": 0.05},
    )
    first = next(iter(stream))
    assert first.choices[0].delta.role == "assistant" and first.choices[0].delta.content == ""
    reasoning, content, finishes, usage_chunks = _collect(stream)
    assert reasoning.strip() and content.strip()
    assert finishes == ["stop"]
    assert len(usage_chunks) == 1 and usage_chunks[0].choices == []
    usage = usage_chunks[0].usage
    poll(lambda: sim.stats.completed >= 1, 10)  # the server counts the request after its last chunk has gone out
    assert usage.completion_tokens == sim.stats.tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # reasoning is the first 20-40% of the tokens
    n_reason = len(reasoning.split())
    assert 0.15 <= n_reason / usage.completion_tokens <= 0.45
    assert sim.stats.last_params["min_p"] == 0.05
    assert sim.stats.completed == 1


def test_no_usage_chunk_without_include_usage(client):
    stream = client.chat.completions.create(model="deepseek-v4-flash", messages=MSG, stream=True, max_tokens=8)
    _, _, finishes, usage_chunks = _collect(stream)
    assert usage_chunks == [] and finishes == ["length"]


def test_non_streaming_with_max_tokens_finishes_length(client, sim):
    resp = client.chat.completions.create(model="deepseek-v4-flash", messages=MSG, max_tokens=12,
                                          extra_body={"min_p": 0.1, "top_k": 20})
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    assert resp.usage.completion_tokens == 12
    assert choice.message.model_extra.get("reasoning")  # the first 12 tokens are still thinking
    assert sim.stats.last_params["min_p"] == 0.1 and sim.stats.last_params["top_k"] == 20


@pytest.mark.parametrize("mode,field", [("reasoning_content", "reasoning_content"), ("think_tags", None)])
def test_reasoning_modes(client, mode, field):
    resp = client.chat.completions.create(model="deepseek-v4-flash", messages=MSG,
                                          extra_body={"sim_reasoning_mode": mode})
    msg = resp.choices[0].message
    if field:
        assert msg.model_extra.get(field) and "reasoning" not in msg.model_extra
        assert "<think>" not in msg.content
    else:
        assert msg.content.startswith("<think>") and "</think>" in msg.content
        assert not msg.model_extra.get("reasoning")


def test_thinking_off_gives_content_only(client):
    stream = client.chat.completions.create(model="deepseek-v4-flash", messages=MSG, stream=True,
                                            extra_body={"chat_template_kwargs": {"thinking": False}})
    reasoning, content, _, _ = _collect(stream)
    assert reasoning == "" and content.strip()


def test_disconnect_mid_stream_aborts_generation(make_sim):
    sim = make_sim(decode_tok_s=50.0)
    with openai.OpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY", max_retries=0) as c:
        stream = c.chat.completions.create(model="deepseek-v4-flash", messages=MSG, stream=True,
                                           extra_body={"ignore_eos": True}, max_tokens=5000)
        for i, _chunk in enumerate(stream):
            if i == 3:
                break
        stream.close()
    poll(lambda: sim.stats.aborted == 1, timeout=5)
    poll(lambda: sim.engine.load() == (0, 0), timeout=5)  # the engine freed the sequence
    assert sim.stats.completed == 0
    assert sim.stats.tokens < 5000
    assert any("Aborted request chatcmpl-" in ln for ln in sim.captured)


def test_periodic_engine_stats_line(make_sim):
    sim = make_sim(stats_interval_s=0.1)
    with openai.OpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY", max_retries=0) as c:
        c.completions.create(model="deepseek-v4-flash", prompt="x", max_tokens=100, extra_body={"ignore_eos": True})
    line = poll(lambda: next((ln for ln in sim.captured if "Engine 000: Avg prompt throughput" in ln), None), 5)
    assert "Avg generation throughput: " in line and "GPU KV cache usage: " in line


def test_unknown_model_is_404_like_vllm(client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="gpt-4", messages=MSG)
    assert "does not exist" in str(exc.value)


def test_bad_min_p_is_400(client):
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="deepseek-v4-flash", messages=MSG, extra_body={"min_p": 3})


def test_max_tokens_against_the_context_like_vllm_0_32(make_sim):
    # real vLLM 0.32 (tests/real_engine): max_tokens above max_model_len is a 400; up to it, the reply is cut
    # to the room the prompt leaves; a prompt beyond the context is a 400 (docs/real-engine.md)
    sim = make_sim(max_model_len=64)
    c = openai.OpenAI(base_url=sim.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as exc:
        c.completions.create(model="deepseek-v4-flash", prompt="hi", max_tokens=65)
    assert "max_tokens=65 cannot be greater than max_model_len=64" in str(exc.value)
    resp = c.completions.create(model="deepseek-v4-flash", prompt="one two three", max_tokens=64,
                                extra_body={"ignore_eos": True})
    used = resp.usage.prompt_tokens + resp.usage.completion_tokens
    assert resp.choices[0].finish_reason == "length" and used == 64, resp.usage
    with pytest.raises(openai.BadRequestError) as exc:
        c.completions.create(model="deepseek-v4-flash", prompt="word " * 200, max_tokens=4)
    assert "exceeds model's maximum context length (64)" in str(exc.value)


def test_completions_endpoint(client):
    resp = client.completions.create(model="deepseek-v4-flash", prompt="Refactor this function", max_tokens=7,
                                     temperature=0.0, extra_body={"ignore_eos": True})
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 7 and resp.choices[0].text.strip()
    chunks = list(client.completions.create(model="deepseek-v4-flash", prompt="hi", max_tokens=5, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices).strip()


def test_models_and_version(sim):
    models = httpx.get(sim.base_url + "/v1/models").json()
    card = models["data"][0]
    assert card["id"] == "deepseek-v4-flash" and card["max_model_len"] == 262144 and card["simulated"] is True
    assert httpx.get(sim.base_url + "/version").json()["simulated"] is True


def test_max_num_seqs_queues_requests(make_sim):
    sim = make_sim(max_num_seqs=1, decode_tok_s=100.0)
    with openai.OpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY", max_retries=0) as c:
        first = c.chat.completions.create(model="deepseek-v4-flash", messages=MSG, stream=True, max_tokens=400,
                                          extra_body={"ignore_eos": True})
        next(iter(first))
        second = c.with_options(timeout=30).chat.completions.create(
            model="deepseek-v4-flash", messages=[{"role": "user", "content": "other"}], stream=True, max_tokens=3)
        poll(lambda: sim.engine.load() == (1, 1), timeout=5)  # one running, one waiting
        first.close()
        assert _collect(second)[2] == ["length"]
