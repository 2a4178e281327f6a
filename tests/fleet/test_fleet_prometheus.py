"""The fleet's Prometheus, live (issue 51 "Done when": a series from each box, labelled `box`, in one query; the
rules fire on a box cut off). Three SIMULATED boxes in their own namespaces, each serving its panel's /metrics
behind a token of its own (bench/fleet/boxmetrics.py); the configuration written by the real CLI (`moet-panel fleet
prometheus-config`) from the fleet file `fleet add --metrics-url --metrics-token` filled; Debian's Prometheus in
the front's namespace with the shipped fleet rules, unedited (their `for: 30s` included: the time to fire measured
here is the one an owner gets, plus the scrape interval). Figures: docs/fleet.md#one-dashboard."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.fleet.netboxes import ROOT, Fleet, NamespacesUnavailable
from tests.polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

RULES = ROOT / "assets" / "monitoring" / "fleet-rules.yml"
BOX_RULES = ROOT / "assets" / "monitoring" / "alert-rules.yml"  # one box's rules, on every box's series at once
PROM_PORT = 9090  # in the front's namespace, new for this run: nothing else listens there


@dataclass
class Live:
    fleet: Fleet
    url: str
    log: Path
    ready_at: float  # monotonic: Prometheus answered /-/ready


def query(url: str, expr: str) -> list[dict[str, Any]]:
    body = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=5).json()
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    # a tag of its own: test_fleet_netns.py's fleet (same pid) may have left its namespaces only just
    f = Fleet(3, decode_tok_s=100, name=f"mpp{os.getpid() % 100000}", metrics=True)
    try:
        f.__enter__()
    except NamespacesUnavailable as exc:
        pytest.fail(f"this machine cannot run the fleet tests: {exc}", pytrace=False)
    prom: subprocess.Popen[bytes] | None = None
    log = f.tmp / "prometheus" / "prometheus.log"
    try:
        f.start()
        d = log.parent
        d.mkdir()
        # the real CLI, from the fleet file; its one knob used here is the scrape (and evaluation) interval
        f.cli("fleet", "prometheus-config", "--out", str(d / "prometheus.yml"), "--interval", "1", "--rules", str(RULES),
              "--rules", str(BOX_RULES))
        with log.open("w") as out:
            prom = subprocess.Popen(
                ["ip", "netns", "exec", f.front_ns, "/usr/bin/prometheus", f"--config.file={d / 'prometheus.yml'}",
                 f"--storage.tsdb.path={d / 'data'}", f"--web.listen-address=127.0.0.1:{PROM_PORT}"],
                stdout=out, stderr=subprocess.STDOUT)
        f.enter_front()  # this thread queries Prometheus and the boxes from the front's namespace
        url = f"http://127.0.0.1:{PROM_PORT}"

        def ready() -> bool:
            assert prom is not None
            if prom.poll() is not None:
                raise AssertionError(f"prometheus exited {prom.returncode}: {log.read_text()[-2000:]}")
            try:
                return httpx.get(url + "/-/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 60, "Prometheus ready", interval=0.2)
        yield Live(f, url, log, time.monotonic())
    finally:
        if prom is not None:
            prom.terminate()  # it is in the front's namespace: close() below kills it anyway
            try:
                prom.wait(20)
            except subprocess.TimeoutExpired:
                prom.kill()
        if log.exists():
            print("--- prometheus.log (tail)\n" + log.read_text(errors="replace")[-2000:])
        f.close()


def test_one_query_returns_a_series_from_each_box_labelled_box(live: Live) -> None:
    f = live.fleet

    def all_boxes() -> list[dict[str, Any]] | None:
        res = query(live.url, 'moet_panel_engine_ready{job="moet-panel"}')
        return res if {r["metric"].get("box") for r in res} == {b.name for b in f.boxes} else None

    res = wait_for(all_boxes, 60, "moet_panel_engine_ready from box1, box2 and box3", interval=0.2)
    took = time.monotonic() - live.ready_at
    print(f"federation: every box's series in Prometheus {took:.2f} s after it was ready (scrape interval 1 s)")
    assert all(r["value"][1] == "1" and r["metric"]["simulated"] == "1" for r in res), res
    # each box's series are its own: its instance is its address, its GPU and gateway figures came with it
    assert {r["metric"]["instance"] for r in res} == {f"{b.addr}:7860" for b in f.boxes}

    def from_every_box(expr: str) -> bool:
        return {r["metric"]["box"] for r in query(live.url, expr)} == {b.name for b in f.boxes}

    wait_for(lambda: from_every_box("moet_panel_gpu_memory_total_bytes"), 30, "every box's GPU memory (its telemetry "
             "hub)", interval=0.2)
    wait_for(lambda: from_every_box("moet_panel_gateway_up == 1"), 30, "every box's gateway serving (its gateway's "
             "figures)", interval=0.2)
    # every target up at one scrape: a single scrape may miss its 1 s timeout on this loaded machine (a run saw the
    # router's exporter absent from one `up` read), which the rules' `for: 30s` rides out
    targets = {*(("moet-panel", b.name, "1") for b in f.boxes), ("vllm-router", "front", "1")}
    wait_for(lambda: {(r["metric"]["job"], r["metric"]["box"], r["value"][1]) for r in query(live.url, "up")} == targets,
             30, f"up == 1 for {sorted(targets)}", interval=0.2)
    # a box's /metrics opens to its own token only (Prometheus has it from the fleet file, in a 0600 file)
    b = f.boxes[0]
    assert httpx.get(b.metrics_url, timeout=5).status_code == 401
    assert httpx.get(b.metrics_url, headers={"Authorization": f"Bearer {f.boxes[1].metrics_token}"},
                     timeout=5).status_code == 401
    # the front's Fleet tab reads the same /metrics (app/backend/fleet/service.py box_figures)
    from app.backend.fleet.service import box_figures

    fig = box_figures(b.metrics_url, b.metrics_token)
    assert not fig.error and fig.profiles == ("quality",) and fig.vram_total_gib, fig


def test_every_rule_evaluates_on_the_fleets_series(live: Live) -> None:
    """The fleet's rules and one box's (alert-rules.yml) over three boxes' series: no rule errs (a join on labels
    that several boxes share, e.g. `on (model_name, profile)`, would find duplicate series and fail)."""
    wait_for(lambda: len(query(live.url, "moet_panel_engine_profile_info")) == 3, 60, "every box's profile", interval=0.2)
    seen = datetime.now(timezone.utc)

    def evaluated() -> list[dict[str, Any]] | None:
        """Every rule, once each was evaluated after all three boxes' series were there."""
        groups = httpx.get(live.url + "/api/v1/rules", timeout=5).json()["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        # Prometheus writes nanoseconds; fromisoformat takes microseconds
        when = [datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", r["lastEvaluation"]).replace("Z", "+00:00"))
                for r in rules]
        return rules if all(w > seen for w in when) else None

    rules = wait_for(evaluated, 30, "every rule evaluated with every box's series", interval=0.2)
    shipped = RULES.read_text().count("- alert: ") + BOX_RULES.read_text().count("- alert: ")
    assert len(rules) == shipped
    assert [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"] == []


def test_the_fleet_rules_fire_on_a_box_cut_off_and_quiet_when_it_is_back(live: Live) -> None:
    """MoetFleetBoxDown (its panel's scrape fails) and MoetFleetWorkerUnhealthy (the router's own health check of its
    gateway fails: the front takes a silent box out of the router, whose exporter keeps the worker's last health, 0)."""
    f = live.fleet
    b = f.boxes[1]
    wait_for(lambda: len(query(live.url, 'up{job="moet-panel"} == 1')) == 3, 60, "every box up", interval=0.2)
    box_down = 'ALERTS{alertname="MoetFleetBoxDown", alertstate="firing"}'
    unhealthy = 'ALERTS{alertname="MoetFleetWorkerUnhealthy", alertstate="firing"}'
    assert query(live.url, box_down) == [] and query(live.url, unhealthy) == []
    cut = time.monotonic()
    f.link(b, False)
    try:
        wait_for(lambda: query(live.url, f'up{{box="{b.name}"}} == 0'), 30, f"{b.name}'s scrape failing", interval=0.2)
        down = time.monotonic() - cut
        res = wait_for(lambda: query(live.url, box_down), 90, "MoetFleetBoxDown firing", interval=0.2)
        fired = time.monotonic() - cut
        assert [r["metric"]["box"] for r in res] == [b.name], res  # that box alone
        assert res[0]["metric"]["severity"] == "critical" and res[0]["metric"]["instance"] == f"{b.addr}:7860"
        assert fired >= 30, "fired before its `for: 30s`"
        res = wait_for(lambda: query(live.url, unhealthy), 90, "MoetFleetWorkerUnhealthy firing", interval=0.2)
        fired_w = time.monotonic() - cut
        assert [r["metric"]["worker"] for r in res] == [b.url], res
        print(f"box cut off: up == 0 after {down:.2f} s; MoetFleetBoxDown firing after {fired:.2f} s, "
              f"MoetFleetWorkerUnhealthy after {fired_w:.2f} s (both `for: 30s`, scrape and evaluation every 1 s)")
    finally:
        f.link(b, True)
    back = time.monotonic()
    wait_for(lambda: not query(live.url, box_down), 60, "MoetFleetBoxDown quiet once the box answers again", interval=0.2)
    quiet = time.monotonic() - back
    wait_for(lambda: not query(live.url, 'ALERTS{alertname="MoetFleetWorkerUnhealthy"}'), 60,
             "MoetFleetWorkerUnhealthy quiet once the router has the box back", interval=0.2)
    print(f"box back: MoetFleetBoxDown resolved after {quiet:.2f} s, MoetFleetWorkerUnhealthy after "
          f"{time.monotonic() - back:.2f} s")
