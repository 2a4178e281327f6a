"""Incremental splitter for inline `<think>…</think>` reasoning inside streamed `content`.

vLLM started without `--reasoning-parser` (the card's command) returns the chain of thought inline.
Tags may be split across chunks ("<thi" + "nk>"), so a possible tag prefix at the end of a chunk is
held back until the next chunk decides it. Work per chunk is O(chunk), never O(answer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"

# "reclassify": a `</think>` came with no `<think>` before it — the chat template put the opening tag
# in the prompt (DeepSeek-R1 style), so everything streamed as answer so far was thinking.
Kind = Literal["reasoning", "content", "reclassify"]


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


@dataclass
class ThinkSplitter:
    """feed(chunk) -> [(kind, text), ...]; flush() at end of stream returns whatever was held back."""

    inside: bool = False
    _held: str = ""
    _after_close: bool = False  # drop the blank lines a model puts between </think> and the answer
    _tag_seen: bool = False

    def feed(self, chunk: str) -> list[tuple[Kind, str]]:
        text = self._held + chunk
        self._held = ""
        out: list[tuple[Kind, str]] = []
        while text:
            if self._after_close and not self.inside:
                text = text.lstrip()
                if not text:
                    break
                self._after_close = False
            tag = CLOSE_TAG if self.inside else OPEN_TAG
            kind: Kind = "reasoning" if self.inside else "content"
            idx = text.find(tag)
            orphan = -1 if (self._tag_seen or self.inside) else text.find(CLOSE_TAG)
            if orphan >= 0 and (idx < 0 or orphan < idx):
                if orphan:
                    out.append(("content", text[:orphan]))
                out.append(("reclassify", ""))
                text = text[orphan + len(CLOSE_TAG) :]
                self._tag_seen = self._after_close = True
                continue
            if idx >= 0:
                if idx:
                    out.append((kind, text[:idx]))
                text = text[idx + len(tag) :]
                self._after_close = self.inside
                self.inside = not self.inside
                self._tag_seen = True
                continue
            keep = _partial_suffix(text, tag)
            if not (self._tag_seen or self.inside):
                keep = max(keep, _partial_suffix(text, CLOSE_TAG))
            emit = text[: len(text) - keep] if keep else text
            if emit:
                out.append((kind, emit))
            self._held = text[len(text) - keep :] if keep else ""
            break
        return out

    def flush(self) -> list[tuple[Kind, str]]:
        """End of stream: a held-back partial tag was just text after all."""
        held, self._held = self._held, ""
        if not held:
            return []
        return [("reasoning" if self.inside else "content", held)]
