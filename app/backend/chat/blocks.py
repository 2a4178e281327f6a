"""Cut a growing Markdown answer into display blocks, so a UI re-renders only the last block.

Browsers re-render a chat message's whole Markdown on every streamed update; one 20k-token message
makes each update cost O(answer) and the stream O(answer²). Cutting at blank lines outside code
fences keeps every update O(block). Incremental: each call scans only the newly completed lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BLOCK_CHARS = 1500  # a block closes at the first blank line after this many characters
THINKING_TAIL_CHARS = 6000  # while thinking streams, show only its tail (the full text once done)


@dataclass
class BlockSplitter:
    min_chars: int = BLOCK_CHARS
    cuts: list[int] = field(default_factory=lambda: [0])  # start offset of each block
    _scanned: int = 0  # text[:_scanned] is complete lines already looked at
    _in_fence: bool = False
    _frozen: list[str] = field(default_factory=list)

    def blocks(self, text: str) -> list[str]:
        """All blocks of `text` (which only ever grows between calls)."""
        end = text.rfind("\n") + 1  # only complete lines can close a block
        pos = self._scanned
        while pos < end:
            nl = text.index("\n", pos)
            line = text[pos:nl]
            if line.lstrip().startswith(("```", "~~~")):
                self._in_fence = not self._in_fence
            elif not line.strip() and not self._in_fence and nl + 1 - self.cuts[-1] >= self.min_chars:
                self._frozen.append(text[self.cuts[-1] : nl + 1].rstrip())
                self.cuts.append(nl + 1)
            pos = nl + 1
        self._scanned = max(self._scanned, end)
        return [*self._frozen, text[self.cuts[-1] :]]


def split_blocks(text: str, min_chars: int = BLOCK_CHARS) -> list[str]:
    return [b for b in BlockSplitter(min_chars).blocks(text) if b.strip()] or [text]


def thinking_tail(text: str, limit: int = THINKING_TAIL_CHARS) -> str:
    if len(text) <= limit:
        return text
    tail = text[-limit:]
    cut = tail.find("\n")
    if 0 <= cut < limit // 4:
        tail = tail[cut + 1 :]
    return f"*… {len(text) - len(tail):,} earlier characters of thinking are shown when it finishes …*\n\n{tail}"
