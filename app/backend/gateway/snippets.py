"""Client snippets for the Access tab and the docs: the OpenAI SDK and curl, with a key placeholder
(never a real key: a page shows a key once, at creation, and nowhere else)."""

from __future__ import annotations

import json
import shlex

KEY_PLACEHOLDER = "YOUR_KEY"


def openai_snippet(url: str, model: str) -> str:
    return (
        "from openai import OpenAI\n\n"
        f'client = OpenAI(base_url="{url}/v1", api_key="{KEY_PLACEHOLDER}")\n'
        "stream = client.chat.completions.create(\n"
        f"    model={json.dumps(model)},\n"
        '    messages=[{"role": "user", "content": "Hello"}],\n'
        "    stream=True,\n"
        ")\n"
        "for chunk in stream:\n"
        '    print(chunk.choices[0].delta.content or "", end="", flush=True)\n'
    )


def curl_snippet(url: str, model: str) -> str:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello"}]})
    return (f"curl {shlex.quote(url + '/v1/chat/completions')} \\\n"
            f'  -H "Authorization: Bearer {KEY_PLACEHOLDER}" \\\n'
            "  -H 'Content-Type: application/json' \\\n"
            f"  -d {shlex.quote(body)}")
