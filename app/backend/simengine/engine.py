"""The SIMULATED engine core: continuous batching on a fixed decode schedule.

One background thread runs "steps": step k of a busy period happens at t0 + k/decode_tok_s and emits
one token for every running request (no per-token sleeps, so the rate does not drift; when the thread
falls behind it catches up in a burst and the HTTP side batches the tokens into fewer SSE chunks).
A request first waits for a free sequence slot (max_num_seqs), then for its simulated prefill
(prompt_tokens / prefill_tok_s) whose end emits the first token, like vLLM's prefill step does.
"""

from __future__ import annotations

import collections
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .metrics import Metrics

# Items put on a request's queue: ("tok", kind, text) | ("end", finish_reason, "") | ("dead", message, "")
Item = tuple[str, str, str]


@dataclass
class SimRequest:
    """One generation: its token source, limits and the queue the HTTP handler reads."""

    request_id: str
    prompt_tokens: int
    limit: int  # tokens to emit at most
    natural: int  # tokens before the simulated EOS (ignored with ignore_eos)
    ignore_eos: bool
    source: Iterator[tuple[str, str]]  # (kind, text); kind is "reasoning" or "content"
    out: "queue.SimpleQueue[Item]" = field(default_factory=queue.SimpleQueue)
    arrived: float = field(default_factory=time.monotonic)
    produced: int = 0
    ready_at: float = 0.0  # prefill end
    started: bool = False
    last_token_at: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    aborted: threading.Event = field(default_factory=threading.Event)
    finish_reason: str = ""

    def abort(self) -> None:
        self.aborted.set()


class EngineCore:
    """Schedules steps for all running requests; calls `on_step(n_tokens)` once per step (a delta tick)."""

    def __init__(self, decode_tok_s: float, prefill_tok_s: float, max_num_seqs: int, metrics: Metrics,
                 on_step: Callable[[int], None], on_token: Callable[[SimRequest], None] | None = None):
        self._interval = 1.0 / decode_tok_s
        self._prefill_tok_s = max(1.0, prefill_tok_s)
        self._max_seqs = max(1, max_num_seqs)
        self._metrics = metrics
        self._on_step = on_step
        self._on_token = on_token
        self._cond = threading.Condition()
        self._waiting: collections.deque[SimRequest] = collections.deque()
        self._running: list[SimRequest] = []
        self._next_step: float | None = None
        self._stop = False
        self._dead_msg = ""
        self._thread = threading.Thread(target=self._loop, name="sim-engine-core", daemon=True)
        self.steps = 0
        self.hung = False  # MOET_SIM_FAIL=hang_mid_generation: wedged, emits nothing more
        self.wedged = False  # MOET_SIM_FAIL=hang_after_ready / SIGUSR1: requests accepted, never scheduled
        self._limbo: list[SimRequest] = []

    def start(self) -> None:
        self._thread.start()

    def submit(self, req: SimRequest) -> None:
        with self._cond:
            if self._dead_msg or self._stop:
                req.out.put(("dead", self._dead_msg or "engine stopped", ""))
                req.done.set()
                return
            if self.wedged:  # the API server took it; the core never sees it (nothing running, nothing waiting)
                self._limbo.append(req)
                return
            self._waiting.append(req)
            self._cond.notify_all()

    def wedge(self) -> None:
        """Hang now: whatever runs stops producing, new requests are never scheduled; /health stays 200."""
        with self._cond:
            self.wedged = self.hung = True
            self._cond.notify_all()

    def kill(self, message: str) -> None:
        """Engine death: every in-flight request gets a `dead` item (its connection is then cut)."""
        with self._cond:
            self._dead_msg = message
            self._stop = True
            for req in itertools.chain(self._waiting, self._running, self._limbo):
                req.out.put(("dead", message, ""))
                req.done.set()
            self._waiting.clear()
            self._running.clear()
            self._limbo.clear()
            self._cond.notify_all()

    def stop(self) -> None:
        self.kill("engine stopped")
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def set_decode_rate(self, decode_tok_s: float) -> None:
        """Change the step rate from the next step on (the SIMULATED degraded mode, quality.py)."""
        with self._cond:
            self._interval = 1.0 / max(0.1, decode_tok_s)
            self._cond.notify_all()

    def load(self) -> tuple[int, int]:
        with self._cond:
            return len(self._running), len(self._waiting)

    # --- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                self._drop_aborted()
                self._admit()
                now = time.monotonic()
                due = self._next_due(now)
                if due is None or due > now:
                    self._cond.wait(timeout=None if due is None else due - now)
                    continue
            self._step(now)

    def _drop_aborted(self) -> None:
        for req in [r for r in self._running if r.aborted.is_set()]:
            self._running.remove(req)
        for req in [r for r in self._waiting if r.aborted.is_set()]:
            self._waiting.remove(req)
        if not any(r.started for r in self._running):
            self._next_step = None
        self._publish_load()

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self._max_seqs:
            req = self._waiting.popleft()
            req.ready_at = time.monotonic() + req.prompt_tokens / self._prefill_tok_s
            self._running.append(req)
        self._publish_load()

    def _publish_load(self) -> None:
        kv = sum(r.prompt_tokens + r.produced for r in self._running)
        self._metrics.set_load(len(self._running), len(self._waiting), kv)

    def _next_due(self, now: float) -> float | None:
        times = [r.ready_at for r in self._running if not r.started]
        if any(r.started for r in self._running):
            if self._next_step is None:  # the first decode step comes one step after the prefill step's token,
                self._next_step = now + self._interval  # as in vLLM (at `now`, a client timed 1 token too many)
            times.append(self._next_step)
        return min(times) if times else None

    def _step(self, now: float) -> None:
        with self._cond:
            running = list(self._running)
        emitted = 0
        for req in running:
            if req.aborted.is_set():
                continue
            if not req.started and req.ready_at <= now:
                req.started = True  # prefill step: emits the first token
                # vLLM counts a request's prompt tokens when its prefill ends, with its first token
                # (IterationStats.update_from_output): a request aborted while waiting or prefilling counts none
                self._metrics.add_prompt(req.prompt_tokens)
                self._metrics.observe_ttft(now - req.arrived)
                emitted += self._emit(req, now)
        if self._next_step is not None and now >= self._next_step:
            for req in running:
                if req.started and req.produced > 0 and not req.done.is_set() and req.last_token_at < now:
                    emitted += self._emit(req, now)
            self._next_step += self._interval
            if now - self._next_step > 1.0:  # stalled (suspended host?): rebase instead of a long burst
                self._next_step = now + self._interval
        if emitted:
            self.steps += 1
            self._on_step(emitted)
        with self._cond:
            self._running = [r for r in self._running if not r.done.is_set()]
            self._publish_load()

    def _emit(self, req: SimRequest, now: float) -> int:
        if self._stop or self.hung:
            return 0
        kind, text = next(req.source)
        req.out.put(("tok", kind, text))
        itl = now - req.last_token_at if req.produced else None
        req.produced += 1
        req.last_token_at = now
        self._metrics.add_generated(1, itl)
        if self._on_token:
            self._on_token(req)
        if req.produced >= req.limit or (not req.ignore_eos and req.produced >= req.natural):
            hit_limit = req.produced >= req.limit and (req.ignore_eos or req.limit < req.natural)
            req.finish_reason = "length" if hit_limit else "stop"
            req.out.put(("end", req.finish_reason, ""))
            self._metrics.finish(req.finish_reason, now - req.arrived)
            req.done.set()
        return 1
