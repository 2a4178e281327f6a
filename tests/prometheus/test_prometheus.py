"""A real Prometheus (Debian's package) with the shipped scrape config and rules, pointed at a demo panel:
it scrapes moet_panel_* over HTTP, loads every rule, and accepts every query of the shipped dashboard."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import BrowserSession, Panel, free_port

from .conftest import MONITORING, close_isolated, isolated_panel, poll

pytestmark = pytest.mark.slow


@dataclass
class Prom:
    url: str
    panel: Panel
    log: Path


def query(url: str, expr: str) -> dict[str, Any]:
    r = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=10)
    body: dict[str, Any] = r.json()
    return body


def templated_config(panel_port: int, scrape_s: int) -> str:
    """The shipped prometheus.yml with the panel's port and a quick interval (nothing else changed)."""
    text = (MONITORING / "prometheus.yml").read_text()
    assert text.count('"127.0.0.1:7860"') == 1 and text.count("scrape_interval: 15s") == 1
    return (text.replace('"127.0.0.1:7860"', f'"127.0.0.1:{panel_port}"')
                .replace("scrape_interval: 15s", f"scrape_interval: {scrape_s}s")
                .replace("evaluation_interval: 15s", f"evaluation_interval: {scrape_s}s"))


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prom]:
    panel = isolated_panel(tmp_path_factory.mktemp("prom-panel"))
    try:
        with tempfile.TemporaryDirectory(prefix="moet-panel-prometheus-") as tmp:
            d = Path(tmp)
            (d / "prometheus.yml").write_text(templated_config(int(panel.url.rsplit(":", 1)[1]), 1))
            (d / "alert-rules.yml").write_text((MONITORING / "alert-rules.yml").read_text())
            port = free_port()
            log = d / "prometheus.log"
            with log.open("w") as out:
                proc = subprocess.Popen(["/usr/bin/prometheus", f"--config.file={d / 'prometheus.yml'}",
                                         f"--storage.tsdb.path={d / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                        stdout=out, stderr=subprocess.STDOUT)
            try:
                url = f"http://127.0.0.1:{port}"

                def ready() -> bool:
                    if proc.poll() is not None:
                        raise AssertionError(f"prometheus exited {proc.returncode}: {log.read_text()[-2000:]}")
                    try:
                        return httpx.get(url + "/-/ready", timeout=2).status_code == 200
                    except httpx.HTTPError:
                        return False

                poll(ready, 60, "Prometheus to be ready")
                yield Prom(url, panel, log)
            finally:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
    finally:
        close_isolated(panel)


def test_prometheus_scrapes_the_panel_with_the_shipped_config(prom: Prom) -> None:
    def seen() -> list[Any]:
        return query(prom.url, "moet_panel_engine_ready")["data"]["result"]

    result = poll(seen, 60, "moet_panel_engine_ready in Prometheus")
    labels = result[0]["metric"]
    assert labels["job"] == "moet-panel" and labels["model_name"] == "deepseek-v4-flash" and labels["simulated"] == "1"
    targets = httpx.get(prom.url + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    panel_target = next(t for t in targets if t["labels"]["job"] == "moet-panel")
    assert panel_target["health"] == "up", panel_target
    assert {t["labels"]["job"] for t in targets} == {"moet-panel", "vllm-engine", "dcgm-exporter"}


def test_prometheus_loads_every_shipped_rule(prom: Prom) -> None:
    groups = httpx.get(prom.url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    shipped = (MONITORING / "alert-rules.yml").read_text().count("- alert: ")
    assert len(rules) == shipped

    def evaluated() -> bool:
        now = httpx.get(prom.url + "/api/v1/rules", timeout=10).json()["data"]["groups"]
        return all(r["health"] == "ok" for g in now for r in g["rules"])

    poll(evaluated, 30, "every rule evaluated without error")


def test_every_dashboard_query_runs(prom: Prom) -> None:
    """Each query as Grafana sends it with the `box` variable at All (its allValue, `.*`), on one box alone whose
    series carry no `box` label: the same series as the query without the matcher (tests/prometheus/test_dashboard.py
    checks the matcher is on every selector)."""
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    all_value = next(v for v in dash["templating"]["list"] if v["name"] == "box")["allValue"]
    poll(lambda: query(prom.url, "count_over_time(moet_panel_build_info[1m]) >= 3")["data"]["result"], 60,
         "three scrapes of the panel")
    at = time.time() - 1  # both forms of a query at one instant: the same data under them

    def at_once(expr: str) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(prom.url + "/api/v1/query", params={"query": expr, "time": at}, timeout=10).json()
        assert body["status"] == "success", (expr, body)
        return body

    def series(b: dict[str, Any]) -> list[str]:
        return sorted(json.dumps(r["metric"], sort_keys=True) for r in b["data"]["result"])

    seen = 0
    for p in dash["panels"]:
        for t in p["targets"]:
            body = at_once(t["expr"].replace("$box", all_value))
            plain = t["expr"].replace(', box=~"$box"', "").replace('{box=~"$box"}', "")
            plain = plain.replace("on (box, ", "on (").replace("by (box, ", "by (")
            assert "box" not in plain, plain
            assert series(body) == series(at_once(plain)), (p["title"], t["expr"])
            seen += bool(body["data"]["result"])
    print(f"dashboard: {seen} of its queries return series on one box, each the same with the box matcher at All")
    assert seen >= 10, f"only {seen} of the dashboard's queries returned series on the demo panel"


def test_prometheus_sees_the_engine_boot_and_shows_it(prom: Prom, browser: BrowserSession) -> None:
    """The demo engine boots while Prometheus watches; the README's screenshot is its graph of it."""
    poll(lambda: query(prom.url, "moet_panel_gpu_memory_used_bytes")["data"]["result"], 60, "GPU memory in Prometheus")
    assert prom.panel.state.engine.start("quality").wait(180)

    def ready() -> bool:
        res = query(prom.url, "moet_panel_engine_ready == 1")["data"]["result"]
        return bool(res)

    poll(ready, 120, "Prometheus to see the engine ready")
    used = query(prom.url, "max_over_time(moet_panel_gpu_memory_used_bytes[5m])")["data"]["result"]
    assert float(used[0]["value"][1]) > 80 * 2**30  # the card's ~93.8 GiB, simulated
    page = browser.new_page(1280, 720)
    expr = "moet_panel_gpu_memory_used_bytes / 2^30 or moet_panel_card_vram_bytes / 2^30"
    page.goto(f"{prom.url}/graph?" + str(httpx.QueryParams({"g0.expr": expr, "g0.tab": "0", "g0.range_input": "30s"})))
    # Prometheus' own page draws both series with their labels in the legend (the simulated GPU and the card's line)
    page.get_by_text('simulated="1"').first.wait_for()
    page.get_by_text('model_name="deepseek-v4-flash"').first.wait_for()
    browser.snap(page, "prometheus-graph", full_page=True, docs="prometheus-graph")
