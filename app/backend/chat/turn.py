"""One assistant reply being streamed.

A reader thread consumes the client's events into append-only buffers; any number of followers
(the web UI, a benchmark) poll coalesced views. The UI thread never blocks in a network read, so a
Stop is immediate even while the engine is silent (long prefill), and the page stays responsive.
Followers that cannot block a thread (an asyncio route) subscribe a wake-up callback instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

from app.backend import oplog
from app.backend.chat.client import ChatStream
from app.backend.chat.events import (
    ContentDelta, Finished, ReasoningDelta, ReclassifyAsReasoning, StreamError, UsageReport,
)
from app.backend.chat.models import Message, MessageStats
from app.backend.chat.stats import StatsRecorder

Phase = Literal["waiting", "thinking", "answering", "done"]


@dataclass(frozen=True)
class TurnView:
    version: int  # bumps on every new piece of text
    reasoning: str
    content: str
    phase: Phase
    reasoning_s: float | None
    tokens: int  # deltas received so far
    rate: float | None  # live tok/s
    ttft_s: float | None
    message: Message  # the stored message; final fields are set once phase == "done"
    # waiting in the panel's gateway's fair queue: the requests that get the GPU first (docs/chat.md "Taking
    # turns"); None when not waiting there (no gateway, or the engine has it)
    queued_ahead: int | None = None

    @property
    def done(self) -> bool:
        return self.phase == "done"


class _Buffer:
    """Append-only text with a cached join: each read costs only the newly arrived pieces."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._joined = ""
        self._n = 0

    def append(self, text: str) -> None:
        self._parts.append(text)

    def text(self) -> str:
        if self._n < len(self._parts):
            self._joined += "".join(self._parts[self._n :])
            self._n = len(self._parts)
        return self._joined


class Turn:
    def __init__(
        self,
        stream: ChatStream,
        message: Message,
        recorder: StatsRecorder,
        on_checkpoint: Callable[[Message], None],
        on_done: Callable[["Turn"], None],
        diagnose: Callable[[StreamError], str],
        checkpoint_s: float = 2.0,
        queue_fn: Callable[[], int | None] | None = None,
    ):
        self.message = message
        self._queue_fn = queue_fn  # this reply's place in the gateway's fair queue (None: not waiting there)
        self._stream = stream
        self._errors = oplog.Once("chat")  # a checkpoint fails the same way many times in one reply
        self._rec = recorder
        self._on_checkpoint = on_checkpoint
        self._on_done = on_done
        self._diagnose = diagnose
        self._checkpoint_s = checkpoint_s
        self._cond = threading.Condition()
        self._reasoning = _Buffer()
        self._content = _Buffer()
        self._version = 0
        self._phase: Phase = "waiting"
        self._stop_requested = threading.Event()
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chat-turn", daemon=True)
        self._wakers: list[Callable[[], None]] = []

    def start(self) -> "Turn":
        self._thread.start()
        return self

    # ---- reader thread ----------------------------------------------------------------------
    def _run(self) -> None:
        final: Finished | StreamError | None = None
        last_checkpoint = time.monotonic()
        try:
            for ev in self._stream:
                self._rec.observe(ev)
                with self._cond:
                    if isinstance(ev, ReasoningDelta):
                        self._reasoning.append(ev.text)
                        self._phase = "thinking" if self._phase == "waiting" else self._phase
                        self._version += 1
                    elif isinstance(ev, ContentDelta):
                        self._content.append(ev.text)
                        self._phase = "answering"
                        self._version += 1
                    elif isinstance(ev, ReclassifyAsReasoning):
                        self._reasoning.append(self._content.text())
                        self._content = _Buffer()
                        self._phase = "thinking"
                        self._version += 1
                    elif isinstance(ev, (Finished, StreamError)):
                        final = ev
                    self._cond.notify_all()
                    wakers = self._wakers[:] if self._wakers else None
                if wakers:
                    self._wake(wakers)
                if not isinstance(ev, UsageReport) and ev.t - last_checkpoint > self._checkpoint_s:
                    last_checkpoint = ev.t
                    self._checkpoint()
        except Exception as exc:  # a bug or an unexpected SDK error must still end the turn visibly
            final = StreamError("broken", f"{type(exc).__name__}: {exc}", time.monotonic())
            oplog.caught("chat", exc, "streaming a reply (ended as broken)", traceback=True)
        self._finalize(final)

    def _checkpoint(self) -> None:
        with self._cond:
            self.message.content = self._content.text()
            self.message.reasoning = self._reasoning.text()
        try:
            self._on_checkpoint(self.message)
        except Exception as exc:  # a failed checkpoint must not kill the stream; the final write reports
            self._errors.caught(exc, "saving a checkpoint of the reply")

    def _finalize(self, final: Finished | StreamError | None) -> None:
        now = time.monotonic()
        msg = self.message
        stats = msg.stats or MessageStats()
        if isinstance(final, Finished):
            msg.status, msg.error = "complete", ""
            stats.finish_reason = final.reason
        elif self._stop_requested.is_set() or (isinstance(final, StreamError) and final.kind == "aborted"):
            msg.status, msg.error = "stopped", ""
            stats.finish_reason = "stopped"
        else:
            err = final or StreamError("broken", "the stream ended without a result", now)
            msg.status = "error"
            msg.error = self._diagnose(err)
            stats.finish_reason = "error"
        with self._cond:
            msg.content = self._content.text()
            msg.reasoning = self._reasoning.text()
            msg.reasoning_s = self._rec.reasoning_seconds(now)
            msg.stats = self._rec.finish(now, stats)
        try:
            self._on_done(self)
        finally:
            with self._cond:
                self._phase = "done"
                self._version += 1
                self.done.set()
                self._cond.notify_all()
                wakers = self._wakers[:]
            self._wake(wakers)

    @staticmethod
    def _wake(wakers: list[Callable[[], None]]) -> None:
        for wake in wakers:
            try:
                wake()
            except Exception as exc:  # a follower's bug must not stop the reply
                oplog.caught("chat", exc, "waking a follower of the reply", traceback=True)

    # ---- followers --------------------------------------------------------------------------
    def stop(self, timeout: float = 5.0) -> bool:
        """Close the stream (the engine aborts the request); keep the partial text. True once final."""
        self._stop_requested.set()
        self._stream.abort()
        return self.done.wait(timeout)

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call `wake()` (from the reader thread, so keep it tiny) after every change of the view and
        once when the turn is done; returns the unsubscribe function. For asyncio followers, e.g.
        `lambda: loop.call_soon_threadsafe(event.set)`: they learn of a token without a thread hop."""
        with self._cond:
            self._wakers.append(wake)
            done = self.done.is_set()
        if done:
            self._wake([wake])

        def unsubscribe() -> None:
            with self._cond:
                if wake in self._wakers:
                    self._wakers.remove(wake)

        return unsubscribe

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested.is_set()

    def view(self) -> TurnView:
        now = time.monotonic()
        ahead = None
        if self._queue_fn is not None and self._phase == "waiting":
            try:
                ahead = self._queue_fn()
            except Exception as exc:  # the place is a nicety: the reply goes on without it
                self._errors.caught(exc, "reading the reply's place in the gateway's queue")
        with self._cond:
            return TurnView(
                version=self._version,
                reasoning=self._reasoning.text(),
                content=self._content.text(),
                phase=self._phase,
                reasoning_s=self.message.reasoning_s if self._phase == "done" else self._rec.reasoning_seconds(now),
                tokens=self._rec.deltas,
                rate=self._rec.live_rate(now),
                ttft_s=None if self._rec.first_token is None else self._rec.first_token - self._rec.started,
                message=self.message,
                queued_ahead=ahead if self._phase == "waiting" else None,
            )

    def follow(self, interval_s: float = 0.08, heartbeat_s: float = 0.5,
               interval_fn: Callable[[TurnView], float] | None = None, first_wait_s: float = 0.05
               ) -> Iterator[TurnView]:
        """Coalesced views: at most one per interval while text flows (`interval_fn(last view)` or
        `interval_s`; the first token and the end are never delayed), and one every `heartbeat_s`
        while nothing arrives, so a consumer that is being cancelled regains control promptly.
        The first view waits up to `first_wait_s` for the first token: a fast engine's first token
        then arrives in the first update instead of queueing behind a placeholder redraw."""
        with self._cond:
            if self._version == 0 and not self.done.is_set():
                self._cond.wait(first_wait_s)
        seen = -1
        last = 0.0
        had_text = False
        interval = interval_s
        while True:
            with self._cond:
                if self._version == seen and not self.done.is_set():
                    self._cond.wait(heartbeat_s)
            wait = interval - (time.monotonic() - last)
            if had_text and wait > 0 and not self.done.is_set():
                self.done.wait(wait)
            view = self.view()
            seen, last = view.version, time.monotonic()
            interval = interval_fn(view) if interval_fn is not None else interval_s
            had_text = had_text or view.tokens > 0
            yield view
            if view.done:
                return
