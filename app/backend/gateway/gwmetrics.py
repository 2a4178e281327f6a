"""The gateway's figures: counted in its process, reported to the panel, exported on the panel's /metrics.

The gateway is a child process of the panel (service.py); it keeps these counters and histograms and writes
them as one JSON line on its stdout every `REPORT_S` (`{"metrics": ...}`); the panel keeps the latest and its
collector exports them (docs/metrics.md "The gateway"). Labels are key names (chosen by the owner, bounded by
the key store), HTTP statuses and refusal reasons: never a key, a path or an address.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.metrics_core import Metric

from app.backend.contracts import JsonObject

REPORT_S = 2.0
TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DURATION_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
QUEUE_BUCKETS = (0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
# why a request was refused before it reached the engine (the `reason` label)
REFUSAL_REASONS = ("no_key", "bad_key", "revoked_key", "rate_limited", "queue_full", "body_too_large",
                   "header_too_large", "header_timeout", "bad_request", "not_ready", "too_many_connections",
                   "evicted_idle", "not_found", "non_finite_number", "out_of_bounds",
                   "wrong_method")

_HISTOGRAMS = ("moet_panel_gateway_ttft_seconds", "moet_panel_gateway_request_duration_seconds",
               "moet_panel_gateway_queue_wait_seconds")
# every sample name `families` can write (docs/metrics.md lists them; tests/prometheus checks both ways)
SERIES = ("moet_panel_gateway_up", "moet_panel_gateway_requests_total", "moet_panel_gateway_tokens_total",
          "moet_panel_gateway_refusals_total",
          "moet_panel_gateway_in_flight", "moet_panel_gateway_queue_length",
          *(h + suffix for h in _HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")))


@dataclass
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last one is +Inf
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, v: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.total += v
        self.n += 1

    def as_json(self) -> JsonObject:
        return {"counts": list(self.counts), "sum": self.total, "count": self.n}


@dataclass
class GatewayMetrics:
    requests: dict[tuple[str, int], int] = field(default_factory=dict)  # (key, status) -> n
    tokens: dict[tuple[str, str], int] = field(default_factory=dict)  # (key, "prompt"|"completion") -> n, as billed
    refusals: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    queue_length: int = 0
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    duration: Histogram = field(default_factory=lambda: Histogram(DURATION_BUCKETS))
    queue_wait: Histogram = field(default_factory=lambda: Histogram(QUEUE_BUCKETS))

    def request(self, key: str, status: int) -> None:
        self.requests[(key, status)] = self.requests.get((key, status), 0) + 1

    def billed(self, key: str, prompt: int | None, completion: int | None) -> None:
        """The tokens a request was billed (the usage table's figures), by key: the Chat tab's own key too."""
        for kind, n in (("prompt", prompt), ("completion", completion)):
            if n:
                self.tokens[(key, kind)] = self.tokens.get((key, kind), 0) + int(n)

    def refused(self, reason: str) -> None:
        self.refusals[reason] = self.refusals.get(reason, 0) + 1

    def as_json(self) -> JsonObject:
        return {"requests": [[k, s, n] for (k, s), n in self.requests.items()],
                "tokens": [[k, kind, n] for (k, kind), n in self.tokens.items()], "refusals": dict(self.refusals),
                "in_flight": self.in_flight, "queue_length": self.queue_length, "ttft": self.ttft.as_json(),
                "duration": self.duration.as_json(), "queue_wait": self.queue_wait.as_json()}


def _hist(name: str, doc: str, bounds: tuple[float, ...], data: JsonObject) -> Metric:
    fam = Metric(name, doc, "histogram")
    counts = list(data.get("counts") or [])
    if len(counts) != len(bounds) + 1:
        counts = [0] * (len(bounds) + 1)
    acc = 0
    for bound, c in zip((*bounds, float("inf")), counts, strict=True):
        acc += int(c)
        fam.add_sample(name + "_bucket", {"le": "+Inf" if bound == float("inf") else repr(bound)}, float(acc))
    fam.add_sample(name + "_sum", {}, float(data.get("sum") or 0.0))
    fam.add_sample(name + "_count", {}, float(acc))
    return fam


def families(data: JsonObject | None, running: bool) -> Iterator[Metric]:
    """The panel's export of the latest report (`data` None: the gateway never reported; all at 0)."""
    up = Metric("moet_panel_gateway_up", "1 while the panel's gateway process serves.", "gauge")
    up.add_sample("moet_panel_gateway_up", {}, float(running))
    yield up
    data = data or {}  # never reported: the families at 0, so rules and panels see series, not gaps
    req = Metric("moet_panel_gateway_requests", "Requests through the gateway by key and HTTP status (refusals "
                 "before a key was known are in moet_panel_gateway_refusals_total).", "counter")
    for row in data.get("requests") or []:
        try:
            key, status, n = str(row[0]), int(row[1]), float(row[2])
        except (TypeError, ValueError, IndexError):
            continue
        req.add_sample("moet_panel_gateway_requests_total", {"key": key, "status": str(status)}, n)
    yield req
    tok = Metric("moet_panel_gateway_tokens", "Tokens billed through the gateway by key and kind (prompt, completion): "
                 "the usage table's figures; the Chat tab's are its own key's.", "counter")
    for row in data.get("tokens") or []:
        try:
            key, kind, n = str(row[0]), str(row[1]), float(row[2])
        except (TypeError, ValueError, IndexError):
            continue
        tok.add_sample("moet_panel_gateway_tokens_total", {"key": key, "kind": kind}, n)
    yield tok
    ref = Metric("moet_panel_gateway_refusals", "Requests or connections the gateway refused, by reason "
                 "(docs/gateway.md \"Threats\").", "counter")
    got = data.get("refusals") or {}
    for reason in (*REFUSAL_REASONS, *(r for r in got if r not in REFUSAL_REASONS)):
        ref.add_sample("moet_panel_gateway_refusals_total", {"reason": str(reason)}, float(got.get(reason, 0)))
    yield ref
    for name, doc in (("in_flight", "Answers the gateway is serving now (queued or at the engine)."),
                      ("queue_length", "Requests waiting in the gateway's fair queue for an engine slot.")):
        g = Metric(f"moet_panel_gateway_{name}", doc, "gauge")
        g.add_sample(f"moet_panel_gateway_{name}", {}, float(data.get(name) or 0))
        yield g
    yield _hist("moet_panel_gateway_ttft_seconds", "Time to the first token through the gateway.", TTFT_BUCKETS,
                data.get("ttft") or {})
    yield _hist("moet_panel_gateway_request_duration_seconds", "Whole request time through the gateway.",
                DURATION_BUCKETS, data.get("duration") or {})
    yield _hist("moet_panel_gateway_queue_wait_seconds", "Time a request waited in the fair queue.", QUEUE_BUCKETS,
                data.get("queue_wait") or {})


class RefusalLog:
    """Refusals into the activity store at a bounded rate (a flood cannot fill it), and one operator's-log line
    a minute with the counts by reason (not one per packet)."""

    def __init__(self, per_s: float = 2.0, burst: float = 20.0, log_every_s: float = 60.0):
        self._rate, self._burst, self._tokens, self._stamp = per_s, burst, burst, time.monotonic()
        self.suppressed = 0
        self._counts: dict[str, int] = {}
        self.log_every = log_every_s
        self._logged = time.monotonic()

    def take(self, reason: str) -> bool:
        self._counts[reason] = self._counts.get(reason, 0) + 1
        now = time.monotonic()
        self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
        self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.suppressed += 1
        return False

    def due(self) -> dict[str, int] | None:
        now = time.monotonic()
        if not self._counts or now - self._logged < self.log_every:
            return None
        counts, self._counts, self._logged = self._counts, {}, now
        return counts
