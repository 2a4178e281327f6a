"""Copyable `curl` and Python `openai` snippets for the current endpoint and sampling."""

from __future__ import annotations

import json
import shlex

from app.backend.chat.client import SamplingParams
from app.backend.engine.runtime.client import EngineEndpoint, api_base, is_uds


def _messages(system_prompt: str, prompt: str) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": system_prompt}] if system_prompt.strip() else []
    return msgs + [{"role": "user", "content": prompt}]


def curl_snippet(base_url: str, model: str, sampling: SamplingParams, system_prompt: str = "",
                 prompt: str = "Hello!") -> str:
    messages = _messages(system_prompt, prompt)
    body: dict[str, object] = {
        "model": model,
        "messages": messages,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "min_p": sampling.min_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if sampling.max_tokens:
        body["max_tokens"] = sampling.max_tokens
    fields = [f'  "{k}": {json.dumps(v, ensure_ascii=False)}' for k, v in body.items() if k != "messages"]
    msgs = ",\n".join("    " + json.dumps(m, ensure_ascii=False) for m in messages)
    text = "{\n" + f'  "messages": [\n{msgs}\n  ],\n' + ",\n".join(fields) + "\n}"
    # an engine on its unix socket (docs/engine.md, "Where the engine listens"): curl goes through the socket
    sock = f"--unix-socket {shlex.quote(EngineEndpoint.parse(base_url).uds)} " if is_uds(base_url) else ""
    return (
        f"curl -N {sock}{shlex.quote(api_base(base_url) + '/chat/completions')} \\\n"
        "  -H 'Content-Type: application/json' \\\n"
        f"  -d {shlex.quote(text)}"
    )


def python_snippet(base_url: str, model: str, sampling: SamplingParams, system_prompt: str = "",
                   prompt: str = "Hello!") -> str:
    max_tokens = f"    max_tokens={sampling.max_tokens},\n" if sampling.max_tokens else ""
    lines = "".join(f"        {json.dumps(m, ensure_ascii=False)},\n" for m in _messages(system_prompt, prompt))
    messages = "[\n" + lines + "    ]"
    if is_uds(base_url):  # the SDK's own HTTP client, bound to the engine's socket
        opening = ("import httpx\nfrom openai import OpenAI\n\n"
                   f"http_client = httpx.Client(transport=httpx.HTTPTransport(uds={EngineEndpoint.parse(base_url).uds!r}))\n"
                   f"client = OpenAI(base_url={api_base(base_url)!r}, api_key=\"EMPTY\", http_client=http_client)\n")
    else:
        opening = f"from openai import OpenAI\n\nclient = OpenAI(base_url={api_base(base_url)!r}, api_key=\"EMPTY\")\n"
    return (
        opening +
        "stream = client.chat.completions.create(\n"
        f"    model={model!r},\n"
        f"    messages={messages},\n"
        f"    temperature={sampling.temperature!r},\n"
        f"    top_p={sampling.top_p!r},\n"
        f"{max_tokens}"
        f"    extra_body={{\"min_p\": {sampling.min_p!r}}},  # vLLM sampling extra\n"
        "    stream=True,\n"
        "    stream_options={\"include_usage\": True},\n"
        ")\n"
        "for chunk in stream:\n"
        "    if chunk.choices:\n"
        "        delta = chunk.choices[0].delta\n"
        "        reasoning = getattr(delta, \"reasoning\", None) or getattr(delta, \"reasoning_content\", None)\n"
        "        print(reasoning or delta.content or \"\", end=\"\", flush=True)\n"
        "    elif chunk.usage:\n"
        "        print(f\"\\n[{chunk.usage.prompt_tokens} -> {chunk.usage.completion_tokens} tokens]\")\n"
    )
