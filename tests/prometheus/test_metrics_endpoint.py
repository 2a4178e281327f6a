"""/metrics on a demo panel: Prometheus' own linter on the live output, every series the shipped rules
and dashboard use, the simulated label, the counters, and that a scrape reads only cached state."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import Live, samples, scrape, used_names

pytestmark = pytest.mark.slow


def test_promtool_check_metrics_passes_on_the_live_output(live: Live) -> None:
    r = scrape(live.panel.url)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    lint = subprocess.run(["promtool", "check", "metrics"], input=r.text, capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    names = {n for n in samples(r.text) if n.startswith("moet_panel_")}
    assert len(names) >= 40, sorted(names)
    assert not [n for n in samples(r.text) if n.startswith("vllm")]  # never re-exported


def test_every_series_the_rules_and_the_dashboard_use_is_exported(live: Live) -> None:
    exported = set(samples(live.text))
    for source, names in used_names().items():
        assert names, source
        missing = sorted(names - exported)
        assert not missing, f"{source} uses series /metrics does not export: {missing}"


def test_the_serving_demo_engine_reads_as_it_is(live: Live) -> None:
    s = samples(live.text)
    one = {tuple(sorted(lab.items())): v for lab, v in s["moet_panel_engine_state"]}
    ready = [dict(k)["state"] for k, v in one.items() if v == 1]
    assert ready == ["ready"]
    assert s["moet_panel_engine_ready"] == [({"model_name": "deepseek-v4-flash", "simulated": "1"}, 1.0)]
    assert s["moet_panel_engine_profile_info"][0][0]["profile"] == "quality"
    switches = {lab["result"]: v for lab, v in s["moet_panel_profile_switches_total"]}
    assert switches["ok"] == 1.0 and switches["failed"] == 0.0
    coverage = s["moet_panel_pool_coverage_ratio"][0][1]
    assert 0.0 < coverage <= 1.0
    assert s["moet_panel_pool_slots"][0][1] == 597  # floor(7 GiB / 12 MiB), the card's pool
    card = {lab["profile"]: v for lab, v in s["moet_panel_card_decode_tokens_per_second"]}
    assert card == {"quality": 48.9, "balanced": 75.0, "speed": 83.2}
    selftest = {lab["profile"]: (lab, v) for lab, v in s["moet_panel_selftest_decode_tokens_per_second"]}
    assert selftest["quality"] == ({"model_name": "deepseek-v4-flash", "profile": "quality", "simulated": "1"}, 48.1)
    vram = s["moet_panel_gpu_memory_used_bytes"][0]
    assert vram[0]["gpu"] == "0" and vram[0]["UUID"].startswith("GPU-") and vram[1] > 80 * 2**30


def test_every_series_from_a_simulated_source_is_labelled(live: Live) -> None:
    """Demo mode: the engine, the GPU, the Hub's downloads and the self-test are stand-ins; the panel's own
    counters, the host and the card's figures are not."""
    simulated_prefixes = ("moet_panel_engine_", "moet_panel_profile_", "moet_panel_gpu_", "moet_panel_pool_",
                          "moet_panel_download_", "moet_panel_selftest_")
    real_prefixes = ("moet_panel_build_info", "moet_panel_host_", "moet_panel_disk_", "moet_panel_card_",
                     "moet_panel_login_", "moet_panel_http_", "moet_panel_metrics_", "moet_panel_alerts_",
                     "moet_panel_telemetry_", "moet_panel_errors_", "moet_panel_gateway_")
    for name, rows in samples(live.text).items():
        for labels, _ in rows:
            if name.startswith(simulated_prefixes):
                assert labels.get("simulated") == "1", (name, labels)
            else:
                assert name.startswith(real_prefixes), name
                assert "simulated" not in labels, (name, labels)


def test_host_and_origin_refusals_are_counted(live: Live) -> None:
    url = live.panel.url
    port = int(url.rsplit(":", 1)[1])

    def refused() -> dict[str, float]:
        return {lab["reason"]: v for lab, v in samples(scrape(url).text)["moet_panel_http_refusals_total"]}

    before = refused()
    assert httpx.get(url + "/config", headers={"Host": f"evil.example:{port}"}).status_code == 421
    assert httpx.post(url + "/gradio_api/queue/join", json={}, headers={"Origin": "http://evil.example"}).status_code == 403
    assert httpx.get(url + "/gradio_api/run-history").status_code == 404
    after = refused()
    assert after["host"] == before["host"] + 1
    assert after["origin"] == before["origin"] + 1
    assert after["unused_route"] == before["unused_route"] + 1
    # /metrics itself is behind the Host allow-list too
    assert httpx.get(url + "/metrics", headers={"Host": f"evil.example:{port}"}).status_code == 421


def test_metrics_answers_get_only_and_carries_the_gates_headers(live: Live) -> None:
    r = httpx.post(live.panel.url + "/metrics", content=b"")
    assert r.status_code == 405
    ok = scrape(live.panel.url)
    assert ok.headers["x-frame-options"] == "DENY" and "content-security-policy" in ok.headers
    assert ok.headers["cache-control"] == "no-store"


class _Spy:
    """Answers only the attributes named; touching anything else fails the test."""

    def __init__(self, name: str, **allowed: Any) -> None:
        self._name, self._allowed = name, allowed

    def __getattr__(self, attr: str) -> Any:
        if attr not in self._allowed:
            raise AssertionError(f"the scrape touched {self._name}.{attr}")
        return self._allowed[attr]


def test_a_scrape_reads_only_cached_state(live: Live, tmp_path: Path) -> None:
    """No NVML, Docker or engine call inside a scrape: the collector sees the services only through
    their cached readers (snapshot, latest frame, counters); anything else raises here."""
    from app.backend.prometheus.access import MetricsAccess, MetricsRoute
    from app.backend.state import AppState

    real = live.panel.state
    frame, snap, counts = real.telemetry.latest(), real.engine.snapshot(), real.downloads.counters()
    state = AppState(settings=real.settings)
    state.telemetry = _Spy("telemetry", latest=lambda: frame)  # type: ignore[assignment]
    state.engine = _Spy("engine", snapshot=lambda: snap)  # type: ignore[assignment]
    state.downloads = _Spy("downloads", counters=lambda: counts, simulated=True, running=False)  # type: ignore[assignment]
    state.selftest = _Spy("selftest", store=real.selftest.store)  # type: ignore[assignment]
    state.gpu = _Spy("gpu")  # type: ignore[assignment]
    text = MetricsRoute(state, MetricsAccess()).render().decode()
    assert samples(text)["moet_panel_pool_slots"][0][1] == 597
    assert "moet_panel_gpu_memory_used_bytes{" in text


def test_docs_list_every_exported_series(live: Live) -> None:
    import re

    from .conftest import ROOT

    doc = (ROOT / "docs" / "metrics.md").read_text()
    listed = set(re.findall(r"`(moet_panel_[a-z0-9_]+)`", doc))
    families = {n for n in samples(live.text) if n.startswith("moet_panel_")}
    assert not families - listed, f"exported but not in docs/metrics.md: {sorted(families - listed)}"
    source = (ROOT / "app" / "backend" / "prometheus" / "collector.py").read_text()
    known = {m.group(2) + ("_total" if m.group(1) == "counter" else "")
             for m in re.finditer(r'b\.(gauge|counter)\("(moet_panel_[a-z_]+)"', source)}
    from app.backend.gateway.gwmetrics import SERIES  # the gateway process's figures, exported beside

    known |= set(SERIES)
    assert not listed - known, f"docs/metrics.md lists series the collector never makes: {sorted(listed - known)}"


def test_caught_errors_are_counted_by_component(live: Live) -> None:
    """issue 39 item 4: every caught error is one log line and one count of moet_panel_errors_total."""
    from app.backend import oplog

    def errors(component: str) -> float:
        got = [v for lab, v in samples(scrape(live.panel.url).text).get("moet_panel_errors_total", [])
               if lab.get("component") == component]
        assert len(got) == 1, got
        return got[0]

    before = errors("service")
    oplog.caught("service", OSError(28, "No space left on device"), "writing service.json")
    assert errors("service") == before + 1
    assert errors("gateway") >= 0  # the known components are exported from the start


def test_no_label_carries_a_filesystem_path(live: Live) -> None:
    """issue 40 item 7: /metrics labels never show where the data lives (the disk gauges said `path=...`)."""
    data_dir = str(live.panel.data_dir)
    for name, rows in samples(live.text).items():
        for labels, _ in rows:
            for key, value in labels.items():
                assert data_dir not in value and not value.startswith("/"), f"{name}{{{key}={value!r}}}"
    assert any(lab == {"disk": "data_dir"} for lab, _ in samples(live.text)["moet_panel_disk_free_bytes"])
