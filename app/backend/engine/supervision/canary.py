"""The generation canary (docs/engine.md, "Liveness"): vLLM's /health can answer 200 while the engine is
wedged with nothing running (vllm#39863), which the token-counter rule cannot see. While the engine is
ready and idle, a tiny real generation every `interval_s`; while requests run, the engine's own token
counters moving are the proof and no canary is sent.

A canary never makes a user's request wait (with `--max-num-seqs 1` one queued request would): it is sent
only when `num_requests_running == 0` and `num_requests_waiting == 0`, asks for ONE token (one prefill step
of a one-word prompt), streams, and while it is in flight the panel reads /metrics every 50 ms — a waiting
request makes it close the connection at once, which aborts it in vLLM (and in the SIMULATED engine). A
canary that yields counts as neither success nor failure. bench/canary_cost measures the cost.

`CanaryState` is pure (no I/O): the controller's liveness thread feeds it and runs `send_canary`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Callable, Literal

import httpx

from app.backend.contracts import Diagnosis
from app.backend.engine.runtime.client import own_http
from app.backend.engine.runtime.metrics_text import GEN_TOKENS, PROMPT_TOKENS, RUNNING, WAITING, parse_metrics

FAILS_TO_STALL = 2
ARRIVAL_POLL_S = 0.05
Outcome = Literal["ok", "failed", "yielded"]


@dataclass(frozen=True)
class Load:
    running: float
    waiting: float
    generated: float | None
    prompted: float | None


def load_from_metrics(text: str) -> Load:
    raw = parse_metrics(text, time.time(), only=RUNNING + WAITING + GEN_TOKENS + PROMPT_TOKENS)
    return Load(raw.first(RUNNING) or 0.0, raw.first(WAITING) or 0.0, raw.first(GEN_TOKENS), raw.first(PROMPT_TOKENS))


@dataclass(frozen=True)
class CanaryResult:
    outcome: Outcome
    detail: str  # "0.04 s", "timeout after 10 s", "HTTP 503", "yielded to a user request"
    seconds: float


class CanaryState:
    """When the next canary is due, and what the results mean. `interval_s` 0 = off."""

    def __init__(self, interval_s: float, timeout_s: float) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.failures = 0
        self.sent = 0
        self.yielded = 0
        self.failures_total = 0  # never reset: a counter for /metrics
        self.last_at = 0.0  # wall time the last judged (ok/failed) canary was sent
        self._proof_at = time.monotonic()  # last canary success or token movement
        self._counts: tuple[float | None, float | None] | None = None
        self.last: CanaryResult | None = None

    def reset(self, proof_at: float | None = None) -> None:
        """A new run: its own history; `proof_at` (monotonic) is when it was last known to serve, e.g. when it
        became ready (default: now)."""
        self.failures, self._counts, self.last = 0, None, None
        self._proof_at = time.monotonic() if proof_at is None else proof_at

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0

    def due(self, load: Load, now: float) -> bool:
        """Feed one /metrics read; True when a canary should go now (idle, and no proof for interval_s)."""
        counts = (load.generated, load.prompted)
        if self._counts is not None and counts != self._counts and self.failures == 0:
            self._proof_at = now  # tokens moved (user traffic): that is the proof of life
        self._counts = counts
        if not self.enabled or load.running > 0 or load.waiting > 0:
            return False
        if self.failures:  # one failure: the second try goes at once (detection <= interval + 2 x timeout)
            return True
        return now - self._proof_at >= self.interval_s

    def seconds_until_due(self, now: float) -> float:
        """How long the liveness loop may sleep before the next canary could be due (it wakes on time)."""
        if not self.enabled:
            return float("inf")
        if self.failures:  # the retry goes within the same pass; a stalled engine is re-tried at the poll pace
            return float("inf")
        return max(0.0, self._proof_at + self.interval_s - now)

    def record(self, r: CanaryResult, now: float) -> bool:
        """Record a result (`now`: when that canary was SENT, so the interval runs start to start); True when
        the engine is now judged stalled (FAILS_TO_STALL failures in a row)."""
        self.last = r
        self.sent += 1
        # the canary's own token moves the engine's counters: the next read takes them as its new baseline,
        # not as a user's proof of life (which would push the next canary back by one poll)
        self._counts = None
        if r.outcome != "yielded":
            self.last_at = time.time() - (time.monotonic() - now)
        if r.outcome == "ok":
            self.failures, self._proof_at = 0, now
        elif r.outcome == "yielded":
            self.yielded += 1
            self._proof_at = now  # a user request arrived: its tokens will be the proof
        else:
            self.failures += 1
            self.failures_total += 1
        return self.failures >= FAILS_TO_STALL

    def status(self) -> str:
        if not self.enabled:
            return "off"
        r = self.last
        if r is None:
            return f"waiting (every {self.interval_s:g} s while idle)"
        if r.outcome == "failed":
            return f"failed {self.failures} of {FAILS_TO_STALL}: {r.detail}"
        return f"{r.outcome} ({r.detail})"


def send_canary(base_url: str, model: str, timeout_s: float, *,
                arrived: Callable[[], bool] | None = None) -> CanaryResult:
    """One 1-token streamed completion. `arrived()` is asked every 50 ms while it runs: True (a user request is
    waiting) closes the connection at once — vLLM aborts a request whose client went away."""
    t0 = time.monotonic()
    body = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0, "stream": True}
    done = threading.Event()
    outcome: list[CanaryResult] = []
    # its own connection (closing it aborts the canary in the engine), over the engine's socket where it has one
    client, root = own_http(base_url, httpx.Timeout(timeout_s, connect=min(2.0, timeout_s)))

    def run() -> None:
        try:
            with client.stream("POST", f"{root}/v1/completions", json=body) as resp:
                if resp.status_code != 200:
                    outcome.append(CanaryResult("failed", f"HTTP {resp.status_code}", time.monotonic() - t0))
                    return
                for line in resp.iter_lines():
                    if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                        chunk = json.loads(line[5:])
                        if chunk.get("choices"):
                            outcome.append(CanaryResult("ok", f"{time.monotonic() - t0:.2f} s", time.monotonic() - t0))
                            return
                outcome.append(CanaryResult("failed", "the stream ended without a token", time.monotonic() - t0))
        except (httpx.HTTPError, ValueError) as exc:
            if not outcome:
                outcome.append(CanaryResult("failed", _why(exc, timeout_s), time.monotonic() - t0))
        finally:
            done.set()

    worker = threading.Thread(target=run, name="engine-canary", daemon=True)
    worker.start()
    try:
        while not done.wait(ARRIVAL_POLL_S):
            if arrived is not None and arrived():
                outcome.append(CanaryResult("yielded", "yielded to a user request", time.monotonic() - t0))
                break
            if time.monotonic() - t0 >= timeout_s:  # the whole canary's deadline (a server that keeps the
                # stream alive without a token never trips the per-read timeout)
                outcome.append(CanaryResult("failed", f"timeout after {timeout_s:g} s (no token)",
                                            time.monotonic() - t0))
                break
    finally:
        client.close()  # closes the stream too: the engine aborts the canary
    worker.join(timeout=2.0)
    return outcome[0]


def _why(exc: BaseException, timeout_s: float) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"timeout after {timeout_s:g} s (no token)"
    return f"{type(exc).__name__}: {exc}"[:160]


def canary_diagnosis(detail: str, interval_s: float, tail: tuple[str, ...]) -> Diagnosis:
    return Diagnosis(
        "stalled", "stalled: the generation canary failed",
        f"{FAILS_TO_STALL} one-token canary completions in a row failed ({detail}) while /health answered 200 and "
        "no request ran — the engine is wedged with nothing running (a known vLLM failure mode, vllm#39863).",
        "With the restart policy on-failure the panel restarts it on the same profile; otherwise Stop, then Start. "
        f"The canary runs every {interval_s:g} s while idle (engine.canary_interval_s in the recipe).",
        (f"canary: {detail}",) + tail,
    )
