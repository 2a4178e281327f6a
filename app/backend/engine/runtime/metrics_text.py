"""Parse vLLM's Prometheus `/metrics` text (vLLM 0.33 names, docs/telemetry.md): the one parser behind the
engine's liveness and canary reads and the telemetry scraper.

Parsing uses prometheus_client's text parser (no regex). Both current and old vLLM names are accepted
(`kv_cache_usage_perc` / `gpu_cache_usage_perc`, `inter_token_latency_seconds` /
`time_per_output_token_seconds`). It lives with the engine (whose endpoint it reads) so that telemetry
imports the engine's parser, never the reverse (tests/test_import_boundaries.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

GEN_TOKENS = ("vllm:generation_tokens",)
PROMPT_TOKENS = ("vllm:prompt_tokens",)
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
TTFT = ("vllm:time_to_first_token_seconds",)
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")


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


def select_families(text: str, names: tuple[str, ...]) -> str:
    """The lines of the families whose names start with one of `names` (a name also prefixes its samples:
    `_total`, `_created`, `_bucket`, `_sum`, `_count`), their `# HELP`/`# TYPE` lines included."""
    keep = [ln for ln in text.splitlines() if (ln[7:] if ln.startswith(("# HELP ", "# TYPE ")) else ln).startswith(names)]
    return "\n".join(keep) + "\n"


def parse_metrics(text: str, ts: float | None = None, only: tuple[str, ...] | None = None) -> RawMetrics:
    """Parse Prometheus text into summed values and histograms; `only`: just those families (select_families:
    a real vLLM page holds dozens, issue 29's idle CPU). ValueError: not Prometheus text (with `only`, checked
    on the whole page when none of them is there)."""
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
