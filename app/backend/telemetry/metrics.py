"""Scrape the engine's Prometheus `/metrics` (vLLM 0.33 names, docs/telemetry.md) and derive rates and latency quantiles.

Parsing uses prometheus_client's text parser (no regex). Both current and old vLLM names are
accepted (`kv_cache_usage_perc` / `gpu_cache_usage_perc`, `inter_token_latency_seconds` /
`time_per_output_token_seconds`). Rates and quantiles are computed between two scrapes, so the
first scrape after a (re)start only establishes the baseline.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import httpx
from prometheus_client.parser import text_string_to_metric_families

GEN_TOKENS = ("vllm:generation_tokens",)
PROMPT_TOKENS = ("vllm:prompt_tokens",)
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
TTFT = ("vllm:time_to_first_token_seconds",)
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
# What `derive` reads. A real vLLM /metrics holds dozens of other families (about 40 histograms); parsing only
# these costs a fraction (issue 29: the idle panel's CPU; docs/telemetry.md, "Cost").
COUNTS = GEN_TOKENS + PROMPT_TOKENS + RUNNING + WAITING + KV_USAGE
DERIVED = COUNTS + TTFT + ITL


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending, +Inf last
    count: float
    total: float

    def minus(self, older: Histogram | None) -> Histogram:
        """Observations made since `older` (a counter reset falls back to the whole histogram)."""
        if older is None or older.count > self.count or len(older.buckets) != len(self.buckets):
            return self
        return Histogram(
            tuple((le, c - oc) for (le, c), (_, oc) in zip(self.buckets, older.buckets, strict=True)),
            self.count - older.count,
            self.total - older.total,
        )

    def quantile(self, q: float) -> float | None:
        """Prometheus' histogram_quantile: linear interpolation inside the bucket."""
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        prev_le, prev_c = 0.0, 0.0
        for le, c in self.buckets:
            if c >= rank:
                if math.isinf(le):
                    return prev_le  # beyond the largest finite bucket: report its bound
                if c == prev_c:
                    return le
                return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
            prev_le, prev_c = le, c
        return prev_le


@dataclass(frozen=True)
class RawMetrics:
    """One scrape, summed over label sets (model_name / engine)."""

    ts: float
    values: dict[str, float]  # family name (counters without _total) -> value
    histograms: dict[str, Histogram]

    def first(self, names: tuple[str, ...]) -> float | None:
        for n in names:
            if n in self.values:
                return self.values[n]
        return None

    def hist(self, names: tuple[str, ...]) -> Histogram | None:
        for n in names:
            if n in self.histograms:
                return self.histograms[n]
        return None


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


def select_families(text: str, names: tuple[str, ...]) -> str:
    """The lines of the families whose names start with one of `names` (a name also prefixes its samples:
    `_total`, `_created`, `_bucket`, `_sum`, `_count`), their `# HELP`/`# TYPE` lines included."""
    keep = [ln for ln in text.splitlines() if (ln[7:] if ln.startswith(("# HELP ", "# TYPE ")) else ln).startswith(names)]
    return "\n".join(keep) + "\n"


def parse_metrics(text: str, ts: float | None = None, only: tuple[str, ...] | None = None) -> RawMetrics:
    """Parse Prometheus text into summed values and histograms; `only`: just those families (select_families).
    ValueError: not Prometheus text (with `only`, checked on the whole page when none of them is there)."""
    if only:
        raw = parse_metrics(select_families(text, only), ts)
        return raw if raw.values or raw.histograms else parse_metrics(text, raw.ts)
    values: dict[str, float] = {}
    hists: dict[str, Histogram] = {}
    for fam in text_string_to_metric_families(text):
        if fam.type == "histogram":
            buckets: dict[float, float] = {}
            count = total = 0.0
            for s in fam.samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels.get("le", "inf"))
                    buckets[le] = buckets.get(le, 0.0) + s.value
                elif s.name.endswith("_count"):
                    count += s.value
                elif s.name.endswith("_sum"):
                    total += s.value
            hists[fam.name] = Histogram(tuple(sorted(buckets.items())), count, total)
        elif fam.type in ("counter", "gauge", "unknown"):  # prometheus_client reports `untyped` as "unknown"
            values[fam.name] = sum(s.value for s in fam.samples if not s.name.endswith("_created"))
    return RawMetrics(ts if ts is not None else time.time(), values, hists)


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
    """Keeps the previous scrape so each call yields rates; one instance per engine base URL."""

    def __init__(self, timeout_s: float = 1.0, client: httpx.Client | None = None) -> None:
        self._client = client or httpx.Client(timeout=timeout_s)
        self._prev: RawMetrics | None = None
        self._base = ""
        self._last_quantiles: MetricsSample | None = None
        self._moved = True  # token counters moved at the last scrape (histograms parsed again)

    def scrape(self, base_url: str) -> MetricsSample:
        """GET {base_url}/metrics; network or parse errors come back in `.error`, never raised."""
        if base_url != self._base:
            self._base, self._prev, self._last_quantiles, self._moved = base_url, None, None, True
        try:
            resp = self._client.get(base_url.rstrip("/") + "/metrics")
            resp.raise_for_status()
            raw = self._parse(resp.text)
        except (httpx.HTTPError, ValueError) as exc:
            return MetricsSample(ts=time.time(), error=f"/metrics unavailable: {exc.__class__.__name__}: {exc}")
        sample = _keep_quantiles(derive(raw, self._prev), self._last_quantiles)
        self._prev = raw
        self._last_quantiles = sample
        return sample

    def _parse(self, text: str) -> RawMetrics:
        """The counters and gauges, and the latency histograms only when tokens were counted in the last two
        scrapes: TTFT and ITL are observed as tokens are made, so unmoved token counters mean unchanged
        histograms (an idle engine's scrape then parses 5 families, not 7 with ~45 buckets). Two, not one: an
        engine may update a counter a moment before the histogram, and a scrape can fall between."""
        raw = parse_metrics(text, only=COUNTS)
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
        self._client.close()


def _keep_quantiles(sample: MetricsSample, last: MetricsSample | None) -> MetricsSample:
    """Without new requests in the window, show the last known latency instead of a gap."""
    if last is None or sample.ttft_p50_s is not None:
        return sample
    return replace(sample, ttft_p50_s=last.ttft_p50_s, ttft_p95_s=last.ttft_p95_s,
                   itl_p50_s=sample.itl_p50_s if sample.itl_p50_s is not None else last.itl_p50_s,
                   itl_p95_s=sample.itl_p95_s if sample.itl_p95_s is not None else last.itl_p95_s)
