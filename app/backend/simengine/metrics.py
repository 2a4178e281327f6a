"""vLLM-named Prometheus metrics (text exposition 0.0.4), stdlib only.

Names and labels follow vLLM 0.33 (`model_name`, `engine`): docs/simengine.md#http-api lists them.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
               20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort")


@dataclass
class _Hist:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, v: float) -> None:
        i = bisect.bisect_left(self.buckets, v)
        if i < len(self.counts):
            self.counts[i] += 1
        self.total += v
        self.n += 1


class Metrics:
    """All counters of one engine; every method is thread-safe."""

    def __init__(self, model_name: str, kv_capacity_tokens: int):
        self._lock = threading.Lock()
        self._labels = f'model_name="{_esc(model_name)}",engine="0"'
        self.kv_capacity_tokens = max(1, kv_capacity_tokens)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = {r: 0 for r in FINISH_REASONS}
        self.running = 0
        self.waiting = 0
        self.kv_tokens = 0
        self.ttft = _Hist(TTFT_BUCKETS)
        self.itl = _Hist(ITL_BUCKETS)
        self.e2e = _Hist(E2E_BUCKETS)

    def add_prompt(self, n: int) -> None:
        with self._lock:
            self.prompt_tokens += n

    def add_generated(self, n: int, itl: float | None) -> None:
        with self._lock:
            self.generation_tokens += n
            if itl is not None:
                self.itl.observe(itl)

    def observe_ttft(self, s: float) -> None:
        with self._lock:
            self.ttft.observe(s)

    def finish(self, reason: str, e2e_s: float) -> None:
        with self._lock:
            self.success[reason if reason in self.success else "stop"] += 1
            self.e2e.observe(e2e_s)

    def set_load(self, running: int, waiting: int, kv_tokens: int) -> None:
        with self._lock:
            self.running, self.waiting, self.kv_tokens = running, waiting, kv_tokens

    def render(self) -> str:
        with self._lock:
            return "".join(self._render_locked())

    def _render_locked(self) -> Iterator[str]:
        lb = self._labels
        yield from _gauge("vllm:num_requests_running", "Number of requests in model execution batches.", lb, self.running)
        yield from _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", lb, self.waiting)
        yield from _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lb,
                          min(1.0, self.kv_tokens / self.kv_capacity_tokens))
        yield from _counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", lb, 0)
        yield from _counter("vllm:prompt_tokens", "Number of prefill tokens processed.", lb, self.prompt_tokens)
        yield from _counter("vllm:generation_tokens", "Number of generation tokens processed.", lb,
                            self.generation_tokens)
        yield "# HELP vllm:request_success_total Count of successfully processed requests.\n"
        yield "# TYPE vllm:request_success_total counter\n"
        for reason, n in self.success.items():
            yield f'vllm:request_success_total{{{lb},finished_reason="{reason}"}} {float(n)}\n'
        yield from _hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lb,
                         self.ttft)
        yield from _hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lb,
                         self.itl)
        yield from _hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lb,
                         self.e2e)


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _gauge(name: str, help_: str, lb: str, v: float) -> Iterator[str]:
    yield f"# HELP {name} {help_}\n# TYPE {name} gauge\n{name}{{{lb}}} {float(v)}\n"


def _counter(name: str, help_: str, lb: str, v: float) -> Iterator[str]:
    yield f"# HELP {name}_total {help_}\n# TYPE {name}_total counter\n{name}_total{{{lb}}} {float(v)}\n"


def _hist(name: str, help_: str, lb: str, h: _Hist) -> Iterator[str]:
    yield f"# HELP {name} {help_}\n# TYPE {name} histogram\n"
    cum = 0
    for edge, c in zip(h.buckets, h.counts, strict=True):
        cum += c
        yield f'{name}_bucket{{{lb},le="{edge}"}} {float(cum)}\n'
    yield f'{name}_bucket{{{lb},le="+Inf"}} {float(h.n)}\n'
    yield f"{name}_sum{{{lb}}} {h.total}\n{name}_count{{{lb}}} {float(h.n)}\n"
