"""Scrape the engine's Prometheus `/metrics` (vLLM 0.33 names, docs/telemetry.md) and derive rates and latency quantiles.

Parsing is `engine/runtime/metrics_text.py`'s (the one parser, shared with the engine's liveness reads). Rates and
quantiles are computed between two scrapes, so the first scrape after a (re)start only establishes the baseline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import httpx

from app.backend.engine.runtime.client import engine_client
from app.backend.engine.runtime.metrics_text import (
    GEN_TOKENS, ITL, KV_USAGE, PROMPT_TOKENS, RUNNING, TTFT, WAITING, Histogram, RawMetrics, parse_metrics,
)

# What `derive` reads. A real vLLM /metrics holds dozens of other families (about 40 histograms); parsing only
# these costs a fraction (issue 29: the idle panel's CPU; docs/telemetry.md, "Cost").
COUNTS = GEN_TOKENS + PROMPT_TOKENS + RUNNING + WAITING + KV_USAGE
DERIVED = COUNTS + TTFT + ITL


@dataclass(frozen=True)
class MetricsSample:
    """What the UI shows from /metrics; None = not known yet."""

    ts: float
    decode_tok_s: float | None = None
    prompt_tok_s: float | None = None
    generation_tokens_total: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    kv_usage_pct: float | None = None
    running: float | None = None
    waiting: float | None = None
    error: str = ""


def derive(cur: RawMetrics, prev: RawMetrics | None) -> MetricsSample:
    """Rates and windowed quantiles between two scrapes."""
    gen = cur.first(GEN_TOKENS)
    decode = prompt = None
    if prev is not None and cur.ts > prev.ts:
        dt = cur.ts - prev.ts
        decode = _rate(gen, prev.first(GEN_TOKENS), dt)
        prompt = _rate(cur.first(PROMPT_TOKENS), prev.first(PROMPT_TOKENS), dt)
    ttft = _window(cur.hist(TTFT), prev.hist(TTFT) if prev else None)
    itl = _window(cur.hist(ITL), prev.hist(ITL) if prev else None)
    kv = cur.first(KV_USAGE)
    return MetricsSample(
        ts=cur.ts,
        decode_tok_s=decode,
        prompt_tok_s=prompt,
        generation_tokens_total=gen,
        ttft_p50_s=ttft.quantile(0.5) if ttft else None,
        ttft_p95_s=ttft.quantile(0.95) if ttft else None,
        itl_p50_s=itl.quantile(0.5) if itl else None,
        itl_p95_s=itl.quantile(0.95) if itl else None,
        kv_usage_pct=kv * 100.0 if kv is not None else None,
        running=cur.first(RUNNING),
        waiting=cur.first(WAITING),
    )


def _rate(now: float | None, before: float | None, dt: float) -> float | None:
    if now is None or before is None:
        return None
    return (now - before) / dt if now >= before else now / dt  # counter reset: count from zero


def _window(cur: Histogram | None, prev: Histogram | None) -> Histogram | None:
    if cur is None:
        return None
    win = cur.minus(prev)
    return win if win.count > 0 else None


class MetricsScraper:
    """Keeps the previous scrape so each call yields rates; one instance per engine base URL. The GET is the
    shared engine client's (engine/runtime/client.py), whose last read the liveness check reuses."""

    def __init__(self, timeout_s: float = 1.0) -> None:
        self._timeout = timeout_s
        self._prev: RawMetrics | None = None
        self._base = ""
        self._last_quantiles: MetricsSample | None = None
        self._moved = True  # token counters moved at the last scrape (histograms parsed again)

    def scrape(self, base_url: str) -> MetricsSample:
        """GET {base_url}/metrics; network or parse errors come back in `.error`, never raised."""
        if base_url != self._base:
            self._base, self._prev, self._last_quantiles, self._moved = base_url, None, None, True
        try:
            read = engine_client(base_url).metrics(timeout=self._timeout)
            raw = self._parse(read.text, read.ts)
        except (httpx.HTTPError, ValueError) as exc:
            return MetricsSample(ts=time.time(), error=f"/metrics unavailable: {exc.__class__.__name__}: {exc}")
        sample = _keep_quantiles(derive(raw, self._prev), self._last_quantiles)
        self._prev = raw
        self._last_quantiles = sample
        return sample

    def _parse(self, text: str, ts: float) -> RawMetrics:
        """The counters and gauges, and the latency histograms only when tokens were counted in the last two
        scrapes: TTFT and ITL are observed as tokens are made, so unmoved token counters mean unchanged
        histograms (an idle engine's scrape then parses 5 families, not 7 with ~45 buckets). Two, not one: an
        engine may update a counter a moment before the histogram, and a scrape can fall between."""
        raw = parse_metrics(text, ts, only=COUNTS)
        prev = self._prev
        moved = prev is None or any(raw.first(n) != prev.first(n) for n in (GEN_TOKENS, PROMPT_TOKENS))
        moved_before, self._moved = self._moved, moved
        if prev is not None and not moved and not moved_before:
            return replace(raw, histograms=prev.histograms)
        return replace(raw, histograms=parse_metrics(text, raw.ts, only=TTFT + ITL).histograms)

    def reset(self) -> None:
        self._prev = None
        self._moved = True
        self._last_quantiles = None

    def close(self) -> None:
        """Nothing to release: the kept-alive client is shared per base URL (engine/runtime/client.py)."""


def _keep_quantiles(sample: MetricsSample, last: MetricsSample | None) -> MetricsSample:
    """Without new requests in the window, show the last known latency instead of a gap."""
    if last is None or sample.ttft_p50_s is not None:
        return sample
    return replace(sample, ttft_p50_s=last.ttft_p50_s, ttft_p95_s=last.ttft_p95_s,
                   itl_p50_s=sample.itl_p50_s if sample.itl_p50_s is not None else last.itl_p50_s,
                   itl_p95_s=sample.itl_p95_s if sample.itl_p95_s is not None else last.itl_p95_s)
