"""A non-streaming answer assembled from the engine's stream (docs/gateway.md "Usage = what the engine did").

The gateway asks the engine for a stream even when its client asked for one JSON answer: every chunk then carries
the engine's counts so far (continuous_usage_stats), so a client that hangs up before the end is billed what the
engine did, as a stream's is. When the engine finishes, its chunks become the OpenAI non-streaming answer vLLM
would have sent (docs/real-engine.md, /work/shared/reference/stack.md §5): chat `message` (content, reasoning,
tool_calls merged by index), completions `text`, logprobs joined, finish_reason, stop_reason, usage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from app.backend.contracts import JsonObject

WHOLE = "whole"  # check_json's "usage to strip" value for a non-streaming request sent to the engine as a stream


@dataclass
class _Choice:
    index: int
    texts: dict[str, list[str]] = field(default_factory=dict)  # chat: content, reasoning…; completions: text
    tool_calls: dict[int, JsonObject] = field(default_factory=dict)
    logprobs: JsonObject | None = None
    finish_reason: object = None
    stop_reason: object = None


class WholeAnswer:
    """The chunks of one streamed answer, joined into the non-streaming JSON of `chat` or completions."""

    def __init__(self, chat: bool):
        self.chat = chat
        self.head: JsonObject = {}  # id, created, model (and anything else the engine sent at the top level)
        self.usage: object = None
        self.choices: dict[int, _Choice] = {}
        self.error: JsonObject | None = None  # an error event mid-stream (vLLM's `data: {"error": …}`)

    def add(self, data: bytes) -> None:
        """One event's JSON (after `data: `); what is not a chunk object is ignored."""
        try:
            obj = json.loads(data)
        except ValueError:
            return
        if not isinstance(obj, dict):
            return
        if isinstance(obj.get("error"), dict):
            self.error = obj["error"]
            return
        for k, v in obj.items():
            if k == "usage":
                if v is not None:
                    self.usage = v
            elif k != "choices" and k not in self.head:
                self.head[k] = v
        for raw in obj.get("choices") or ():
            if isinstance(raw, dict):
                self._choice(raw)

    def _choice(self, raw: JsonObject) -> None:
        i = raw.get("index", 0)
        i = i if isinstance(i, int) else 0
        ch = self.choices.get(i) or self.choices.setdefault(i, _Choice(i))
        parts = raw.get("delta") if self.chat else {"text": raw.get("text")}
        for k, v in (parts if isinstance(parts, dict) else {}).items():
            if k == "tool_calls" and isinstance(v, list):
                self._tool_calls(ch, v)
            elif k != "role" and isinstance(v, str):
                ch.texts.setdefault(k, []).append(v)  # joined at the end: a long answer is not copied per token
        self._logprobs(ch, raw.get("logprobs"))
        if raw.get("finish_reason") is not None:
            ch.finish_reason = raw["finish_reason"]
        if raw.get("stop_reason") is not None:
            ch.stop_reason = raw["stop_reason"]

    @staticmethod
    def _tool_calls(ch: _Choice, calls: list[Any]) -> None:
        """A tool call's first delta carries its id, type and name; the later ones pieces of its arguments."""
        for d in calls:
            if not isinstance(d, dict):
                continue
            n = d.get("index", 0)
            call = ch.tool_calls.setdefault(n if isinstance(n, int) else 0,
                                            {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
            for k in ("id", "type"):
                if d.get(k) is not None:
                    call[k] = d[k]
            fn = d.get("function")
            if isinstance(fn, dict):
                for k in ("name", "arguments"):
                    if isinstance(fn.get(k), str):
                        call["function"][k] += fn[k]

    @staticmethod
    def _logprobs(ch: _Choice, lp: Any) -> None:
        """Chat: `content` (and `refusal`) lists joined; completions: the parallel lists joined, offsets as sent."""
        if not isinstance(lp, dict):
            return
        if ch.logprobs is None:
            ch.logprobs = {}
        for k, v in lp.items():
            if isinstance(v, list):
                ch.logprobs.setdefault(k, []).extend(v)
            elif k not in ch.logprobs or ch.logprobs[k] is None:
                ch.logprobs[k] = v

    def status(self) -> int:
        """The answer's HTTP status: 200, or an error event's code (vLLM answers a non-streaming request's error
        with it as the status)."""
        code = self.error.get("code") if self.error is not None else 200
        return code if isinstance(code, int) and 400 <= code <= 599 else (200 if self.error is None else 500)

    def body(self) -> bytes:
        """The answer as vLLM sends a non-streaming one (an error event: its error object)."""
        if self.error is not None:
            return json.dumps({"error": self.error}, separators=(",", ":")).encode()
        out: JsonObject = dict(self.head)
        out["object"] = "chat.completion" if self.chat else "text_completion"
        out["choices"] = [self._whole_choice(self.choices[i]) for i in sorted(self.choices)]
        out["usage"] = self.usage
        if self.chat:
            out.setdefault("prompt_logprobs", None)
        return json.dumps(out, separators=(",", ":")).encode()

    def _whole_choice(self, ch: _Choice) -> JsonObject:
        if not self.chat:
            return {"index": ch.index, "text": "".join(ch.texts.get("text", ())), "logprobs": ch.logprobs,
                    "finish_reason": ch.finish_reason, "stop_reason": ch.stop_reason}
        calls = [ch.tool_calls[n] for n in sorted(ch.tool_calls)]
        texts = {k: "".join(v) for k, v in ch.texts.items()}
        message: JsonObject = {"role": "assistant", "content": texts.get("content", None if calls else "")}
        message.update((k, v) for k, v in texts.items() if k != "content")
        if "reasoning_content" not in message:
            message.setdefault("reasoning", None)  # vLLM's ChatMessage always has it (stack.md §5.2)
        message["tool_calls"] = calls
        return {"index": ch.index, "message": message, "logprobs": ch.logprobs, "finish_reason": ch.finish_reason,
                "stop_reason": ch.stop_reason}
