"""/metrics scraping: Prometheus text parsing, rates, histogram quantiles, old names, errors, the sim engine."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from app.backend.engine.runtime.metrics_text import Histogram, parse_metrics
from app.backend.telemetry.metrics import MetricsScraper, derive

NEW = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m",engine="0"}} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m",engine="0"}} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{model_name="m",engine="0"}} 0.25
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{model_name="m",engine="0"}} {gen}
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{model_name="m",engine="0"}} {prompt}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{le="0.1",model_name="m"}} {t1}
vllm:time_to_first_token_seconds_bucket{{le="0.5",model_name="m"}} {t2}
vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {t2}
vllm:time_to_first_token_seconds_count{{model_name="m"}} {t2}
vllm:time_to_first_token_seconds_sum{{model_name="m"}} 1.0
"""

OLD = """# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="m"} 0.0
vllm:time_per_output_token_seconds_bucket{le="0.025",model_name="m"} 10.0
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 10.0
vllm:time_per_output_token_seconds_count{model_name="m"} 10.0
vllm:time_per_output_token_seconds_sum{model_name="m"} 0.2
"""


def test_rates_and_quantiles_between_scrapes() -> None:
    a = parse_metrics(NEW.format(gen=100.0, prompt=1000.0, t1=0, t2=0), ts=10.0)
    b = parse_metrics(NEW.format(gen=150.0, prompt=1400.0, t1=4, t2=8), ts=12.0)
    first = derive(a, None)
    assert first.decode_tok_s is None and first.generation_tokens_total == 100.0  # baseline only
    s = derive(b, a)
    assert s.decode_tok_s == 25.0 and s.prompt_tok_s == 200.0
    assert (s.running, s.waiting, s.kv_usage_pct) == (1.0, 2.0, 25.0)
    # 8 observations: 4 ≤ 0.1 s, 4 in (0.1, 0.5]: p50 = 0.1, p95 interpolates inside the second bucket
    assert s.ttft_p50_s == pytest.approx(0.1)
    assert s.ttft_p95_s == pytest.approx(0.1 + 0.4 * (7.6 - 4) / 4)


def test_old_metric_names_accepted() -> None:
    s = derive(parse_metrics(OLD), None)
    assert s.kv_usage_pct == 50.0
    assert 0.01 < s.itl_p50_s <= 0.025


def test_untyped_series_are_kept() -> None:
    # `# TYPE x untyped` and a sample with no TYPE line both parse as prometheus_client's "unknown" type
    raw = parse_metrics("# TYPE vllm:num_requests_running untyped\nvllm:num_requests_running 3\n"
                        "vllm:num_requests_waiting{model_name=\"m\"} 4\n", ts=1.0)
    assert raw.values == {"vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 4.0}
    assert derive(raw, None).running == 3.0


def test_counter_reset_and_inf_bucket() -> None:
    a = parse_metrics(NEW.format(gen=500.0, prompt=0, t1=0, t2=0), ts=1.0)
    b = parse_metrics(NEW.format(gen=20.0, prompt=0, t1=0, t2=0), ts=2.0)
    assert derive(b, a).decode_tok_s == 20.0  # engine restarted: count from zero, never negative
    h = Histogram(((1.0, 0.0), (float("inf"), 5.0)), 5.0, 50.0)
    assert h.quantile(0.5) == 1.0  # beyond the last finite bucket: its bound, not infinity
    assert Histogram((), 0, 0).quantile(0.5) is None


class _Server:
    def __init__(self) -> None:
        self.body = NEW.format(gen=0.0, prompt=0.0, t1=0, t2=0)
        srv = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                data = srv.body.encode()
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def metrics_server():
    s = _Server()
    try:
        yield s
    finally:
        s.close()


def test_scraper_over_http_and_errors(metrics_server) -> None:
    sc = MetricsScraper(timeout_s=1.0)
    try:
        assert sc.scrape(metrics_server.url).decode_tok_s is None
        metrics_server.body = NEW.format(gen=30.0, prompt=0.0, t1=1, t2=1)
        s = sc.scrape(metrics_server.url)
        assert s.decode_tok_s is not None and s.decode_tok_s > 0 and s.error == ""
        metrics_server.body = "this is { not prometheus"
        bad = sc.scrape(metrics_server.url)
        assert bad.error.startswith("/metrics unavailable") and bad.decode_tok_s is None
        dead = sc.scrape("http://127.0.0.1:9")  # nothing listens on the discard port
        assert dead.error.startswith("/metrics unavailable")
    finally:
        sc.close()


@pytest.mark.slow
def test_scraper_against_simulated_engine() -> None:
    from app.backend.simengine.config import SimEngineConfig
    from app.backend.simengine.server import SimEngineServer

    srv = SimEngineServer(SimEngineConfig(port=0, boot_s=0.2, decode_tok_s=400.0), log=lambda line: None)
    srv.start()
    sc = MetricsScraper(timeout_s=2.0)
    try:
        assert srv.wait_ready(20)
        base = sc.scrape(srv.base_url)
        assert base.error == "" and base.kv_usage_pct is not None
        r = httpx.post(srv.base_url + "/v1/completions", timeout=30,
                       json={"model": "deepseek-v4-flash", "prompt": "hello", "max_tokens": 120, "ignore_eos": True})
        assert r.status_code == 200
        deadline = time.monotonic() + 10
        s = sc.scrape(srv.base_url)
        while (s.decode_tok_s or 0) <= 0 and time.monotonic() < deadline:
            s = sc.scrape(srv.base_url)
        assert s.generation_tokens_total >= 120
        assert s.ttft_p50_s is not None and s.itl_p50_s is not None
    finally:
        sc.close()
        srv.stop()
