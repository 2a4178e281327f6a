"""Turn with a scripted stream: reclassified thinking, final fields, follow() ending."""

from __future__ import annotations

import time

from app.backend.chat.events import ContentDelta, Finished, ReclassifyAsReasoning, UsageReport
from app.backend.chat.models import Message, MessageStats
from app.backend.chat.stats import StatsRecorder
from app.backend.chat.turn import Turn


class ScriptedStream:
    def __init__(self, events):
        self.events = events
        self.aborted = False

    def __iter__(self):
        yield from self.events

    def abort(self) -> None:
        self.aborted = True


def test_text_before_an_orphan_close_tag_becomes_thinking() -> None:
    t0 = time.monotonic()
    events = [ContentDelta("I think", t0 + 0.1), ContentDelta(" hard", t0 + 0.2), ReclassifyAsReasoning(t0 + 0.3),
              ContentDelta("Answer.", t0 + 0.5), UsageReport(5, 4, 9, t0 + 0.6), Finished("stop", t0 + 0.6)]
    done: list[Message] = []
    turn = Turn(ScriptedStream(events), Message(role="assistant", content="", status="streaming",
                                                stats=MessageStats(profile_id="quality")),
                StatsRecorder(started=t0), on_checkpoint=lambda m: None, on_done=lambda t: done.append(t.message),
                diagnose=lambda e: e.message).start()
    views = list(turn.follow(interval_s=0.01))
    msg = views[-1].message
    assert done == [msg] and msg.status == "complete"
    assert (msg.reasoning, msg.content) == ("I think hard", "Answer.")
    assert abs(msg.reasoning_s - 0.4) < 1e-6  # first thinking token -> first real answer token
    assert msg.stats.completion_tokens == 4 and msg.stats.profile_id == "quality"
    assert abs(msg.stats.ttft_s - 0.1) < 1e-6
