"""Liveness after ready (docs/engine.md, "Liveness"): vLLM's `/health` can answer 200 while the engine is
wedged, so a ready engine is also judged by its own counters. Requests running (`vllm:num_requests_running`
> 0) while neither `vllm:generation_tokens_total` nor `vllm:prompt_tokens_total` moved for `stall_after_s`
= stalled. Pure: fed one scrape at a time, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.backend.contracts import Diagnosis
from app.backend.engine.runtime.metrics_text import GEN_TOKENS, PROMPT_TOKENS, RUNNING, parse_metrics


@dataclass(frozen=True)
class Progress:
    ts: float
    running: float | None
    generated: float | None
    prompted: float | None


@dataclass(frozen=True)
class Verdict:
    stalled: bool
    running: float = 0.0
    idle_s: float = 0.0  # seconds since a token was last counted while requests ran


def progress_from_metrics(text: str, ts: float) -> Progress:
    raw = parse_metrics(text, ts, only=RUNNING + GEN_TOKENS + PROMPT_TOKENS)  # 3 families of dozens
    return Progress(ts, raw.first(RUNNING), raw.first(GEN_TOKENS), raw.first(PROMPT_TOKENS))


class LivenessTracker:
    """`feed(progress)` after each scrape; `Verdict.stalled` once the counters froze with work running."""

    def __init__(self, stall_after_s: float) -> None:
        self.stall_after_s = stall_after_s
        self._last_counts: tuple[float | None, float | None] | None = None
        self._moved_at: float | None = None

    def reset(self) -> None:
        self._last_counts, self._moved_at = None, None

    def feed(self, p: Progress) -> Verdict:
        counts = (p.generated, p.prompted)
        running = p.running or 0.0
        if counts != self._last_counts or running <= 0 or self._moved_at is None:
            self._last_counts, self._moved_at = counts, p.ts  # moving, idle, or first sample
            return Verdict(False, running, 0.0)
        idle = p.ts - self._moved_at
        return Verdict(idle >= self.stall_after_s, running, idle)


def stall_diagnosis(running: float, idle_s: float, limit_s: float, tail: tuple[str, ...]) -> Diagnosis:
    """The stalled badge's diagnosis: the evidence (running requests, seconds since the last token, last lines)."""
    return Diagnosis(
        "stalled", "stalled: requests running, no tokens",
        f"{int(running)} request(s) are running but vllm:generation_tokens_total (and prompt tokens) have not moved "
        f"for {idle_s:.0f} s (limit {limit_s:.0f} s) while /health still answers 200 — the engine is "
        "wedged (a known vLLM failure mode).",
        "Restart the engine on the same profile (Engine tab: Stop, then Start; or set engine.restart_on_stall = "
        "true in the recipe to do it automatically). Keep the Logs view: the last lines before the stall are the "
        "evidence to report.",
        (f"running requests: {int(running)}", f"seconds since the last token: {idle_s:.0f}") + tail,
    )
