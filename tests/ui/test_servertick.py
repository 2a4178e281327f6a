"""app.ui.servertick: the web server's own tick once a second, not ten times, and close() still ends it at once
(issue 49, docs/ui-and-safety.md "Idle cost")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import gradio as gr
import pytest
import uvicorn
from gradio import http_server

from app.ui import servertick
from tests.polling import wait_for

from ..conftest import free_port


def test_pinned_uvicorn_gets_the_slow_tick() -> None:
    """Fails on a uvicorn upgrade: compare servertick's main_loop with the new Server.main_loop and on_tick (the
    once-a-second work under `counter % 10 == 0`, the exit checks), then move COPIED_FROM."""
    assert uvicorn.__version__.startswith(servertick.COPIED_FROM)
    assert servertick.install() is True
    assert servertick.install() is True  # idempotent: close() is wrapped once


@pytest.fixture
def ticks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, float]]:
    """(server, when) of each tick of every Gradio server in this process (other tests' panels may still run)."""
    seen: list[tuple[Any, float]] = []
    on_tick = http_server.Server.on_tick

    async def counted(self: Any, counter: int) -> bool:
        seen.append((self, time.monotonic()))
        return bool(await on_tick(self, counter))

    monkeypatch.setattr(http_server.Server, "on_tick", counted)
    return seen


@pytest.fixture
def served() -> Iterator[gr.Blocks]:
    with gr.Blocks() as blocks:
        gr.Textbox()
    assert servertick.install()
    blocks.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        yield blocks
    finally:
        blocks.close()


def test_the_server_ticks_once_a_second(ticks: list[tuple[Any, float]], served: gr.Blocks) -> None:
    def mine() -> list[float]:
        return [t for server, t in list(ticks) if server is served.server]

    wait_for(lambda: len(mine()) >= 4, timeout=20, what="four ticks of the web server")
    seen = mine()
    gaps = [b - a for a, b in zip(seen, seen[1:], strict=False)]
    assert min(gaps) >= 0.9 * servertick.TICK_S, gaps  # uvicorn's own loop: every 0.1 s


def test_close_ends_the_server_at_once(monkeypatch: pytest.MonkeyPatch, ticks: list[tuple[Any, float]]) -> None:
    monkeypatch.setattr(servertick, "TICK_S", 60.0)  # only close()'s wake-up can end the loop's wait
    with gr.Blocks() as blocks:
        gr.Textbox()
    assert servertick.install()
    blocks.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    wait_for(lambda: any(server is blocks.server for server, _ in list(ticks)), timeout=20,
             what="the server's first tick")
    blocks.close()  # Gradio's close joins the server's thread for at most 5 s
    assert not blocks.server.thread.is_alive()  # without the wake-up it would wait out the 60 s tick
