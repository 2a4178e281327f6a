"""The live log tails drawn by the page feed (issue 49, app/ui/logtail.py): followed line by line, they show
exactly what filtering the whole tail shows, through new runs and a tail that rolls over; a page's stream sends
a box's text only when it changed, and nothing for the panel's own probe lines the view hides."""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.backend.contracts import LogLine
from app.backend.engine.logs.loglines import LogFilter
from app.backend.engine.logs.logstore import LogStore
from app.ui.logtail import LiveTail, TailStream, log_text, view_of

PROBE = 'INFO:     127.0.0.1:51234 - "GET /metrics HTTP/1.1" 200 OK'


class FakeController:
    """The two things a LiveTail reads of an engine controller: its log store and its tail."""

    def __init__(self, logs: LogStore) -> None:
        self.logs = logs

    def recent_logs(self, n: int = 250) -> list[LogLine]:
        return self.logs.recent(n)


@pytest.fixture
def store() -> Iterator[LogStore]:
    home = Path(tempfile.mkdtemp(prefix="moet-logtail-", dir=Path.home()))
    try:
        s = LogStore(home / "engine-logs", tail=60)
        s.begin_run("c1", 0.0, persist=False)
        yield s
    finally:
        shutil.rmtree(home, ignore_errors=True)


VIEWS = [LogFilter(), LogFilter("stderr"), LogFilter(needle="tier"), LogFilter(probes=True), LogFilter("stdout", "ERR")]


def test_followed_line_by_line_it_shows_what_the_whole_tail_shows(store: LogStore) -> None:
    tail = LiveTail(FakeController(store))  # type: ignore[arg-type]
    rng = random.Random(49)
    texts = [PROBE, "moe_w2 delta tier: 469 slots", "ERROR something", "Engine 000: Avg prompt throughput: 0.0",
             "warn: tier ERR"]
    for step in range(600):
        r = rng.random()
        if r < 0.01:
            store.begin_run(f"c{step}", float(step), persist=False)  # a new run clears the tail
        elif r < 0.05:  # more lines at once than the tail holds (60): the tail is read whole again
            for _ in range(rng.randint(55, 90)):
                store.append(LogLine(rng.choice(texts), rng.choice(["stdout", "stderr"])), persist=False)
        else:
            for _ in range(rng.randint(1, 4)):
                store.append(LogLine(f"{rng.choice(texts)} #{step}", rng.choice(["stdout", "stderr"])),
                             persist=False)
        for view in rng.sample(VIEWS, 3):  # not every view every step: some follow across several moves
            for show in (5, 40):
                assert tail.text(view, show) == log_text(store.recent(100000), view, show), (step, view, show)


def test_a_pages_stream_sends_the_text_only_when_it_changed(store: LogStore) -> None:
    tail = LiveTail(FakeController(store))  # type: ignore[arg-type]
    store.append(LogLine("Application startup complete."), persist=False)
    stream = TailStream(tail, "engine-log", view_of({"stream": "both", "needle": ""}), 300)
    assert stream.poll() == {"text": {"engine-log": "out | Application startup complete."}}
    assert stream.poll() is None  # nothing moved
    store.append(LogLine(PROBE), persist=False)
    assert stream.poll() is None  # the panel's own probe: hidden in this view, nothing sent
    store.append(LogLine("Engine 000: Avg prompt throughput: 0.0", "stderr"), persist=False)
    assert stream.poll() == {"text": {"engine-log": "out | Application startup complete.\n"
                                                    "err | Engine 000: Avg prompt throughput: 0.0"}}
    probes = TailStream(tail, "logs-text", view_of({"stream": "stdout", "probes": "1"}), 1000)
    assert probes.poll() == {"text": {"logs-text": f"Application startup complete.\n{PROBE}"}}
    # a saved run or Follow live off: the box is the page's own, the stream sends nothing for it
    assert TailStream(None, "logs-text", LogFilter(), 1000).poll() is None


def test_a_view_from_a_pages_query_refuses_a_stream_it_does_not_know() -> None:
    assert view_of({"stream": "stderr", "needle": "tier", "probes": "1"}) == LogFilter("stderr", "tier", True)
    assert view_of({"stream": "both; drop"}) == LogFilter()
