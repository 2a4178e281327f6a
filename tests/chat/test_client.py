"""The streaming client against the SIMULATED engine's vLLM wire format."""

import pytest

from app.backend.chat.client import ChatRequest, ChatStream, SamplingParams
from app.backend.chat.events import ContentDelta, Finished, ReasoningDelta, StreamError, UsageReport
from app.backend.engine.runtime.client import EngineClient

SAMPLING = SamplingParams(1.0, 1.0, 0.05, None)


def collect(client: EngineClient, model: str, extra: dict | None = None, sampling: SamplingParams = SAMPLING):
    events = list(ChatStream(client, ChatRequest(model, [{"role": "user", "content": "hi"}], sampling, extra or {})))
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    return events, reasoning, content


@pytest.mark.parametrize("mode", ["reasoning", "reasoning_content", "think_tags"])
def test_reasoning_arrives_every_way(sim, mode: str) -> None:
    client = EngineClient(sim.base_url)
    try:
        ref_events, ref_reasoning, ref_content = collect(client, sim.config.served_name, {"sim_reasoning_mode": "reasoning"})
        events, reasoning, content = collect(client, sim.config.served_name, {"sim_reasoning_mode": mode})
    finally:
        client.close()
    assert reasoning and content
    # Same request, same seed: the same thought and answer whichever way the reasoning travelled.
    assert reasoning.strip() == ref_reasoning.strip()
    assert content == ref_content
    assert "<think>" not in content and "</think>" not in content
    assert isinstance(events[-1], Finished) and events[-1].reason == "stop"
    # Reasoning comes first, then the answer.
    first_content = next(i for i, e in enumerate(events) if isinstance(e, ContentDelta))
    assert not any(isinstance(e, ReasoningDelta) for e in events[first_content:])


def test_usage_chunk_and_min_p_reach_the_server(sim) -> None:
    client = EngineClient(sim.base_url)
    try:
        events, reasoning, content = collect(client, sim.config.served_name, sampling=SamplingParams(0.7, 0.9, 0.05, 40))
    finally:
        client.close()
    usage = [e for e in events if isinstance(e, UsageReport)]
    assert len(usage) == 1 and usage[0].completion_tokens == 40 and usage[0].prompt_tokens > 0
    assert usage[0].total_tokens == usage[0].prompt_tokens + 40
    assert isinstance(events[-1], Finished) and events[-1].reason == "length"
    params = sim.stats.last_params
    assert params["min_p"] == 0.05 and params["temperature"] == 0.7 and params["top_p"] == 0.9


def test_nothing_listening_is_a_connect_error() -> None:
    client = EngineClient("http://127.0.0.1:9")
    try:
        events, _, _ = collect(client, "m")
    finally:
        client.close()
    assert len(events) == 1 and isinstance(events[0], StreamError)
    assert events[0].kind == "connect" and "127.0.0.1:9" in events[0].message


def test_server_refusal_is_an_http_error(sim) -> None:
    client = EngineClient(sim.base_url)
    try:
        events, _, _ = collect(client, "no-such-model")
    finally:
        client.close()
    assert isinstance(events[0], StreamError) and events[0].kind == "http" and events[0].status_code == 404
    assert "no-such-model" in events[0].message
