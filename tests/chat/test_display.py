"""Redraw policy for long replies: bounded thinking tail, interval growing with the reply."""

from app.backend.chat.display import BASE_INTERVAL_S, MAX_INTERVAL_S, thinking_tail, update_interval
from app.backend.chat.models import Message


def test_interval_grows_with_what_is_on_screen() -> None:
    assert update_interval(0) == BASE_INTERVAL_S
    assert update_interval(10_000) == BASE_INTERVAL_S
    assert update_interval(120_000) > 3 * BASE_INTERVAL_S
    assert update_interval(10_000_000) == MAX_INTERVAL_S
    # redraw work per second ∝ size / interval stays flat for long replies
    assert 120_000 / update_interval(120_000) == 240_000 / update_interval(240_000)


def test_thinking_tail_is_bounded() -> None:
    text = "\n".join(f"step {i}: " + "x" * 50 for i in range(1000))
    tail = thinking_tail(text)
    assert len(tail) < 6200 and tail.endswith(text[-100:]) and "earlier characters" in tail
    assert thinking_tail("short") == "short"


def test_finished_reply_renders_thinking_answer_stats() -> None:
    from app.backend.chat.models import MessageStats
    from app.ui.chat import render_message

    stats = MessageStats(profile_id="quality", simulated=True, ttft_s=0.21, decode_tok_s=48.7, prompt_tokens=35,
                         completion_tokens=812, wall_s=17.1)
    msgs = render_message(Message(role="assistant", content="answer", reasoning="hmm", reasoning_s=1.25,
                                  stats=stats))
    assert msgs[0] == {"role": "assistant", "content": "hmm",
                       "metadata": {"title": "Thinking", "status": "done", "duration": 1.2}}
    assert msgs[1] == {"role": "assistant", "content": "answer"}
    assert msgs[2]["content"] == ("<sub>profile quality · TTFT 0.21 s · 48.7 tok/s · 35→812 tokens · 17.1 s · "
                                  "SIMULATED</sub>")
    stopped = render_message(Message(role="assistant", content="part", status="stopped", stats=stats))
    assert stopped[-1]["content"].startswith("<sub>Stopped — partial answer kept")
    failed = render_message(Message(role="assistant", content="part", status="error", error="engine <died>"))
    assert "engine &lt;died&gt;" in failed[1]["content"]
