"""A non-streaming request is sent to the engine as a stream and joined back into one answer (gateway/assemble.py,
docs/gateway.md "Usage = what the engine did"): the client gets what the engine's own non-streaming answer is,
and a hang-up is billed what the engine did. The SIMULATED engine in-process."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from app.backend.gateway.assemble import WholeAnswer
from tests.gateway.conftest import SERVED

MSG = [{"role": "user", "content": "Say something about mixtures of experts."}]


def _without_ids(answer: dict[str, Any]) -> dict[str, Any]:
    """The answer without its id and time; a message's `reasoning: null` dropped (vLLM always sends the field, the
    simulated engine only in its `reasoning` mode; the gateway sends it as vLLM does)."""
    for choice in answer.get("choices", []):
        message = choice.get("message") or {}
        if message.get("reasoning", "") is None:
            del message["reasoning"]
    return {k: v for k, v in answer.items() if k not in ("id", "created")}


@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 300, "sim_reasoning_mode": "reasoning"}),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 300, "sim_reasoning_mode": "reasoning_content"}),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 300, "sim_reasoning_mode": "think_tags"}),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 40, "sim_reasoning_mode": "none"}),
    ("/v1/completions", {"prompt": "Mixtures of experts are", "max_tokens": 50}),
])
def test_a_non_streaming_answer_is_the_engines_own(make_gateway, route: str, body: dict[str, Any]):
    gw = make_gateway(decode_tok_s=4000.0)
    key = gw.key("whole")
    payload = {"model": SERVED, **body}
    direct = httpx.post(gw.sim.base_url + route, json=payload, timeout=10)
    via = httpx.post(gw.url + route, json=payload, headers={"Authorization": f"Bearer {key}"}, timeout=10)
    assert direct.status_code == via.status_code == 200
    assert via.headers["content-type"].startswith("application/json")
    assert _without_ids(via.json()) == _without_ids(direct.json())
    assert gw.sim.stats.last_params.get("stream") is True  # the engine was asked for a stream


def test_an_engine_error_is_passed_through_as_json(make_gateway):
    gw = make_gateway()
    key = gw.key("err")
    r = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=10,
                   json={"model": "no-such-model", "messages": MSG, "max_tokens": 5})
    direct = httpx.post(gw.sim.base_url + "/v1/chat/completions", timeout=10,
                        json={"model": "no-such-model", "messages": MSG, "max_tokens": 5})
    assert r.status_code == direct.status_code and r.status_code >= 400
    assert r.headers["content-type"].startswith("application/json") and r.json() == direct.json()


def _chunk(choice: dict[str, Any], usage: Any = None) -> bytes:
    return json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "m",
                       "choices": [choice] if choice else [], "usage": usage}).encode()


def test_tool_calls_and_logprobs_are_joined_as_vllm_sends_them_whole():
    w = WholeAnswer(chat=True)
    w.add(_chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}))
    w.add(_chunk({"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                        "function": {"name": "get", "arguments": ""}}]},
                  "logprobs": {"content": [{"token": "a", "logprob": -0.1}]}, "finish_reason": None}))
    w.add(_chunk({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"x\":"}}]},
                  "logprobs": {"content": [{"token": "b", "logprob": -0.2}]}, "finish_reason": None}))
    w.add(_chunk({"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]},
                  "logprobs": None, "finish_reason": "tool_calls", "stop_reason": None}))
    w.add(_chunk({}, {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}))
    got = json.loads(w.body())
    assert got["object"] == "chat.completion" and got["id"] == "c1" and got["created"] == 7
    choice = got["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [{"id": "call_1", "type": "function",
                                                "function": {"name": "get", "arguments": "{\"x\":1}"}}]
    assert [t["token"] for t in choice["logprobs"]["content"]] == ["a", "b"]
    assert got["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


def test_an_error_event_mid_stream_becomes_the_answers_error_status():
    w = WholeAnswer(chat=False)
    w.add(json.dumps({"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "a"}]}).encode())
    w.add(json.dumps({"error": {"message": "boom", "type": "BadRequestError", "code": 400}}).encode())
    assert w.status() == 400
    assert json.loads(w.body()) == {"error": {"message": "boom", "type": "BadRequestError", "code": 400}}
