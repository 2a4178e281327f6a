"""app.ui.idlequeue: Gradio's queue waits for work instead of polling every 1 ms (issue 29, idle CPU)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import gradio as gr
import pytest
from gradio_client import Client

from app.ui import idlequeue

from ..conftest import free_port


def test_pinned_gradio_gets_the_event_driven_loop() -> None:
    """Fails on a Gradio upgrade: compare idlequeue._start_processing with the new Queue.start_processing,
    then move COPIED_FROM."""
    with gr.Blocks() as blocks:
        gr.Button()
    assert gr.__version__.startswith(idlequeue.COPIED_FROM)
    assert idlequeue.install(blocks) is idlequeue.QueueMode.EVENT_DRIVEN


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Each idle wait of the queue's loop; the safety re-check made long, so only a wake-up can start an event."""
    seen: list[float] = []
    wait = idlequeue._Waker.wait

    async def counted(self: idlequeue._Waker, timeout: float) -> None:
        seen.append(time.monotonic())
        await wait(self, timeout)

    monkeypatch.setattr(idlequeue._Waker, "wait", counted)
    monkeypatch.setattr(idlequeue, "IDLE_RECHECK_S", 60.0)
    return seen


@pytest.fixture
def served() -> Iterator[str]:
    with gr.Blocks() as blocks:
        box = gr.Textbox()
        out = gr.Textbox()
        box.submit(lambda s: s.upper(), box, out, api_name="upper")
    assert idlequeue.install(blocks) is idlequeue.QueueMode.EVENT_DRIVEN
    _, url, _ = blocks.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True,
                              quiet=True)
    try:
        yield url
    finally:
        blocks.close()


def test_events_run_at_once_and_the_idle_loop_sleeps(waits: list[float], served: str) -> None:
    client = Client(served, verbose=False)
    t0 = time.monotonic()
    for word in ("one", "two", "three"):  # each would wait out the 60 s re-check if push did not wake the loop
        assert client.predict(word, api_name="/upper") == word.upper()
    assert time.monotonic() - t0 < 30
    idle_from = len(waits)
    time.sleep(1.0)  # idle: Gradio's own loop would look for work ~1,000 times here
    assert len(waits) - idle_from <= 1
