"""How often, and how much of, a streaming reply a UI should redraw.

Browsers re-render a chat's Markdown and re-layout the whole chat on every streamed update, so one
update costs time proportional to what is on screen (measured with Gradio 6.31's Chatbot: cutting
the answer into many messages made it worse, not better). Two rules keep a 20k-token answer smooth:
the update interval grows with the reply's size, so the redraw work per second (and per 1k tokens)
stays flat; and while the model thinks, only the tail of its thinking is shown (all of it once done).
"""

from __future__ import annotations

import html
from dataclasses import dataclass

BASE_INTERVAL_S = 0.08  # ~12 updates/s for short replies
CHARS_PER_SECOND_OF_INTERVAL = 400_000  # 120 kB on screen -> one update every 0.3 s
MAX_INTERVAL_S = 1.0
THINKING_TAIL_CHARS = 6000


def update_interval(chars_on_screen: int) -> float:
    return min(MAX_INTERVAL_S, max(BASE_INTERVAL_S, chars_on_screen / CHARS_PER_SECOND_OF_INTERVAL))


def thinking_tail(text: str, limit: int = THINKING_TAIL_CHARS) -> str:
    if len(text) <= limit:
        return text
    tail = text[-limit:]
    cut = tail.find("\n")
    if 0 <= cut < limit // 4:
        tail = tail[cut + 1 :]
    return f"*… {len(text) - len(tail):,} earlier characters of thinking are shown when it finishes …*\n\n{tail}"


# ---- bounded rendering (docs/chat.md#long-and-hostile-messages) ----------------------------------
# The browser's Markdown renderer (marked, inside Gradio's Chatbot) is quadratic in runs of emphasis
# and code-span delimiters: `*a` × 50,000 took 90 s, 2 MB over 7 min (issue 30). Measured on this box
# with Gradio 6.31, `*a` × 3,000 (3,000 delimiters) renders in ~0.4 s, so a message with more
# delimiters than MAX_MARKS, or longer than MAX_MARKDOWN_CHARS, is shown as plain text: escaped,
# its first PLAIN_PREVIEW_CHARS only, with a "render as Markdown" choice on the page. The page as a
# whole has a budget too (many messages just under the limits add up), and shows the newest
# MAX_SHOWN_MESSAGES messages of a conversation.
MARKS = frozenset("*_`~<[")  # delimiters whose runs make the renderer slow (measured)
MAX_MARKS = 1_000
MAX_MARKDOWN_CHARS = 60_000
PAGE_MARKS = 4_000
PAGE_MARKDOWN_CHARS = 400_000
PLAIN_PREVIEW_CHARS = 8_000
MAX_SHOWN_MESSAGES = 200


def marks(text: str) -> int:
    """How many renderer-slowing delimiters a text holds outside fenced code blocks (a fence is parsed
    in linear time, and code is full of `_` and `*`). Counting is C speed: 2 MB in a few ms."""
    if "```" not in text and "~~~" not in text:
        return sum(text.count(ch) for ch in MARKS)
    total, fence = 0, ""
    for line in text.split("\n"):
        stripped = line.lstrip(" ")
        if fence:
            if stripped.startswith(fence) and not stripped.strip(fence[0]).strip():
                fence = ""
            continue
        if len(line) - len(stripped) < 4 and stripped[:3] in ("```", "~~~"):
            fence = stripped[: len(stripped) - len(stripped.lstrip(stripped[0]))]
            continue
        total += sum(line.count(ch) for ch in MARKS)
    return total


@dataclass
class RenderBudget:
    """What one page render may still hand to the Markdown renderer; shared by the messages of one view."""

    marks: int = PAGE_MARKS
    chars: int = PAGE_MARKDOWN_CHARS
    full: bool = False  # the person chose "render as Markdown": no limits
    plain: int = 0  # texts shown as plain text so far (the caller counts them)

    def admit(self, text: str) -> bool:
        """True when `text` may be rendered as Markdown (and charge it to the budget)."""
        if self.full:
            return True
        n_marks = marks(text)
        if len(text) > MAX_MARKDOWN_CHARS or n_marks > MAX_MARKS:
            return False
        if n_marks > self.marks or len(text) > self.chars:
            return False
        self.marks -= n_marks
        self.chars -= len(text)
        return True


def plain_text(text: str, tail: bool = False) -> str:
    """`text` as escaped plain text for a Markdown renderer (a raw <pre> block, parsed in linear time),
    bounded to PLAIN_PREVIEW_CHARS: its head, or its tail for a reply still streaming."""
    limit = PLAIN_PREVIEW_CHARS
    shown = text if len(text) <= limit else (text[-limit:] if tail else text[:limit])
    note = ("shown as plain text: too long or too much markup to render quickly"
            if len(shown) == len(text) else
            f"shown as plain text, {'last' if tail else 'first'} {len(shown):,} of {len(text):,} characters")
    return (f'<pre class="chat-plain">{html.escape(shown)}</pre>\n\n'
            f"<sub>{note} · 'Render long messages as Markdown' below the chat, or export it</sub>")


def bounded(text: str, budget: RenderBudget, tail: bool = False) -> tuple[str, bool]:
    """(what to hand the renderer, whether it is the plain-text form)."""
    if budget.admit(text):
        return text, False
    return plain_text(text, tail), True
