"""Display blocks for long answers: incremental, never inside a code fence, nothing lost."""

import random

from app.backend.chat.blocks import BlockSplitter, split_blocks, thinking_tail
from app.backend.chat.models import Message
from app.ui.chat import render_message


def long_markdown(rng: random.Random) -> str:
    paras = []
    for i in range(60):
        if i % 7 == 3:  # a code block with blank lines inside
            paras.append("```python\n" + "\n\n".join(f"x = {j}  # " + "pad " * 40 for j in range(6)) + "\n```")
        else:
            paras.append(" ".join(["word"] * rng.randint(20, 200)))
    return "\n\n".join(paras)


def squash(text: str) -> str:
    return "".join(text.split())


def test_streamed_blocks_keep_every_character_and_fences_whole() -> None:
    rng = random.Random(7)
    text = long_markdown(rng)
    splitter = BlockSplitter()
    i = 0
    while i < len(text):
        i = min(len(text), i + rng.randint(1, 60))
        blocks = splitter.blocks(text[:i])
        assert squash("".join(blocks)) == squash(text[:i])
    assert len(blocks) > 10
    for block in blocks[:-1]:
        assert block.count("```") % 2 == 0
        assert len(block) >= 1500
    assert split_blocks(text) == [b for b in blocks if b.strip()]


def test_each_update_touches_only_the_last_block() -> None:
    text = long_markdown(random.Random(1))
    splitter = BlockSplitter()
    before = splitter.blocks(text[: len(text) // 2])
    after = splitter.blocks(text[: len(text) // 2 + 500])
    assert after[: len(before) - 1] == before[:-1]  # frozen blocks are the same objects' text


def test_long_history_answer_renders_as_blocks_in_one_reply() -> None:
    text = long_markdown(random.Random(3))
    msgs = render_message(Message(role="assistant", content=text, reasoning="hmm", reasoning_s=1.25))
    assert msgs[0]["metadata"] == {"title": "Thinking", "status": "done", "duration": 1.2}
    answer = [m for m in msgs[1:] if not m["content"].startswith("<sub>")]
    assert len(answer) > 10 and squash("".join(m["content"] for m in answer)) == squash(text)


def test_thinking_tail_is_bounded() -> None:
    text = "\n".join(f"step {i}: " + "x" * 50 for i in range(1000))
    tail = thinking_tail(text)
    assert len(tail) < 6200 and tail.endswith(text[-100:]) and "earlier characters" in tail
    assert thinking_tail("short") == "short"
