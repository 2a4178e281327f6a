import random

import pytest

from app.backend.chat.think import ThinkSplitter


def feed_in_pieces(text: str, rng: random.Random) -> list:
    """Feed text to a ThinkSplitter in random 1-9 character pieces; all it emitted, flush included."""
    s = ThinkSplitter()
    out = []
    i = 0
    while i < len(text):
        n = rng.randint(1, 9)
        out += s.feed(text[i : i + n])
        i += n
    return out + s.flush()


def split_all(text: str, rng: random.Random) -> tuple[str, str]:
    out = feed_in_pieces(text, rng)
    return ("".join(t for k, t in out if k == "reasoning"), "".join(t for k, t in out if k == "content"))


@pytest.mark.parametrize("seed", range(50))
def test_tags_split_across_chunks(seed: int) -> None:
    text = "<think>I reason <b> about\nthis</think>\n\nThe answer <thi is 42. <think>more</think> end"
    reasoning, content = split_all(text, random.Random(seed))
    assert reasoning == "I reason <b> about\nthismore"
    assert content == "The answer <thi is 42. end"


def test_held_partial_tag_is_text_at_end() -> None:
    s = ThinkSplitter()
    assert s.feed("a <thin") == [("content", "a ")]
    assert s.flush() == [("content", "<thin")]


def test_unclosed_think_stays_reasoning() -> None:
    s = ThinkSplitter()
    out = s.feed("<think>still thinking</th") + s.flush()
    assert "".join(t for k, t in out if k == "reasoning") == "still thinking</th"
    assert not [t for k, t in out if k == "content"]


@pytest.mark.parametrize("seed", range(30))
def test_orphan_close_tag_reclassifies_what_came_before(seed: int) -> None:
    """DeepSeek-style templates open <think> in the prompt: the output only closes it."""
    text = "I reason about </thi and this</think>\n\nThe answer. A literal </think> stays text."
    out = feed_in_pieces(text, random.Random(seed))
    kinds = [k for k, _ in out]
    assert kinds.count("reclassify") == 1
    cut = kinds.index("reclassify")
    before = "".join(t for k, t in out[:cut])
    after = "".join(t for k, t in out[cut + 1 :] if k == "content")
    assert before == "I reason about </thi and this"
    assert after == "The answer. A literal </think> stays text."
