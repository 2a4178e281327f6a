"""How often, and how much of, a streaming reply a UI should redraw.

Browsers re-render a chat's Markdown and re-layout the whole chat on every streamed update, so one
update costs time proportional to what is on screen (measured with Gradio 6.31's Chatbot: cutting
the answer into many messages made it worse, not better). Two rules keep a 20k-token answer smooth:
the update interval grows with the reply's size, so the redraw work per second (and per 1k tokens)
stays flat; and while the model thinks, only the tail of its thinking is shown (all of it once done).
"""

from __future__ import annotations

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
