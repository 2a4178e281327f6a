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
    assert stopped[-2]["content"] == "**Stopped — this answer is incomplete.**"  # its own line (issue 49)
    assert stopped[-1]["content"].startswith("<sub>partial answer kept · profile quality")
    failed = render_message(Message(role="assistant", content="part", status="error", error="engine <died>"))
    assert "engine &lt;died&gt;" in failed[1]["content"]


# ---- bounded rendering (issue 30 finding 5) --------------------------------------------------------

def test_over_the_limits_a_text_is_escaped_bounded_plain_text() -> None:
    from app.backend.chat.display import MAX_MARKS, PLAIN_PREVIEW_CHARS, RenderBudget, bounded, marks

    assert marks("*a" * 10) == 10 and marks("x\n```py\n__init__(**kw)\n```\n*a*") == 2  # code fences are cheap
    fine = "*a* " * (MAX_MARKS // 2 - 1)
    assert bounded(fine, RenderBudget()) == (fine, False)
    for hostile in ("*a" * 50_000, "<b>" + "`a" * 1200 + "</b>", "x" * 2_000_000):
        shown, plain = bounded(hostile, RenderBudget())
        assert plain and shown.startswith('<pre class="chat-plain">') and "shown as plain text" in shown
        body = shown[len('<pre class="chat-plain">'): shown.index("</pre>")]
        assert "<b>" not in body and len(body) <= PLAIN_PREVIEW_CHARS * 5  # escaped (&lt; is 4 chars), bounded
    assert bounded("*a" * 50_000, RenderBudget(full=True))[1] is False  # the person's choice


def test_the_page_budget_is_spent_newest_first_and_long_histories_are_capped() -> None:
    from app.backend.chat.display import MAX_MARKS, MAX_SHOWN_MESSAGES, PAGE_MARKS
    from app.ui.chat import history_view

    just_under = "*a" * (MAX_MARKS - 1)
    msgs = [Message(role="assistant", content=f"{i} {just_under}") for i in range(PAGE_MARKS // MAX_MARKS + 2)]
    view = history_view(msgs)
    plain = [m["content"].startswith("<pre") for m in view.messages]
    assert plain[-1] is False and plain[0] is True and view.plain == sum(plain)  # the newest render
    many = [Message(role="user", content=f"m{i}") for i in range(MAX_SHOWN_MESSAGES + 50)]
    view = history_view(many)
    assert len(view.messages) == MAX_SHOWN_MESSAGES + 1 and "50 earlier messages" in view.messages[0]["content"]
    assert view.messages[-1]["content"] == f"m{MAX_SHOWN_MESSAGES + 49}"
    assert len(history_view(many, full=True).messages) == MAX_SHOWN_MESSAGES + 50


def test_a_live_reply_over_the_limits_streams_its_tail_as_plain_text() -> None:
    from app.backend.chat.turn import TurnView
    from app.ui.chat import render_live

    content = "*a" * 40_000 + "THE END"
    view = TurnView(version=3, reasoning="", content=content, phase="answering", reasoning_s=None, tokens=9,
                    rate=None, ttft_s=0.1, message=Message(role="assistant", content=""))
    shown = render_live(view)[0]["content"]
    assert shown.startswith('<pre class="chat-plain">') and "THE END" in shown and "last 8,000" in shown


def test_a_reply_waiting_in_the_gateways_queue_shows_its_place() -> None:
    """issue 50 item 3: the Chat tab's reply takes its turn in the gateway's fair queue and says so."""
    from app.backend.chat.turn import TurnView
    from app.ui.chat import render_live

    def line(ahead: int | None) -> str:
        view = TurnView(version=0, reasoning="", content="", phase="waiting", reasoning_s=None, tokens=0, rate=None,
                        ttft_s=None, message=Message(role="assistant", content=""), queued_ahead=ahead)
        return render_live(view)[-1]["content"]

    assert "waiting for the GPU (2 ahead)" in line(2) and "waiting for the GPU (0 ahead)" in line(0)
    assert "waiting for the first token" in line(None)  # not in a queue (no gateway, or at the engine)
