"""`moet-panel fleet prometheus-config`: one Prometheus for the whole fleet (docs/fleet.md#one-dashboard).

Every box's panel `/metrics` is scraped by a job of its own (each box has its own metrics token), every series
labelled `box="<name>"`, the job relabelled `moet-panel` so the shipped rules and dashboard read them unchanged;
the router's exporter (the front's loopback) is scraped as job `vllm-router`, labelled `box="front"`. The fleet's
rules (a box down, a worker the router marks unhealthy) are `assets/monitoring/fleet-rules.yml`; one box's rules
(`alert-rules.yml`) load beside them, and the dashboard's `box` variable picks the boxes (run live:
tests/fleet/test_fleet_prometheus.py)."""

from __future__ import annotations

from pathlib import Path

import json

from app.backend.contracts import JsonObject
from app.backend.fleet.fleetfile import FleetConfig

RULES_FILE = "fleet-rules.yml"


def _target(url: str) -> tuple[str, str, str]:
    """(scheme, host:port, metrics path) of a metrics URL."""
    from urllib.parse import urlsplit

    p = urlsplit(url if "://" in url else f"http://{url}")
    return p.scheme or "http", p.netloc, p.path or "/metrics"


def prometheus_config(cfg: FleetConfig, rule_files: list[str] | None = None, interval_s: int = 15,
                      token_dir: Path | None = None) -> JsonObject:
    """The configuration as a dictionary (`render` writes it). `token_dir`: write each box's metrics token
    to a 0600 file there and point at it (`credentials_file`); None: the token inline."""
    jobs: list[JsonObject] = []
    for b in cfg.boxes:
        if not b.metrics_url:
            continue
        scheme, host, path = _target(b.metrics_url)
        job: JsonObject = {
            "job_name": f"moet-panel-{b.name}", "scheme": scheme, "metrics_path": path,
            "static_configs": [{"targets": [host], "labels": {"box": b.name}}],
            # one job per box for its own token; the series keep the job name the shipped rules use
            "relabel_configs": [{"target_label": "job", "replacement": "moet-panel"}],
        }
        if b.metrics_token:
            if token_dir is not None:
                from app.backend.files.atomic import atomic_write

                f = Path(token_dir) / f"fleet-{b.name}.token"
                atomic_write(f, b.metrics_token, mode=0o600)
                job["authorization"] = {"type": "Bearer", "credentials_file": str(f)}
            else:
                job["authorization"] = {"type": "Bearer", "credentials": b.metrics_token}
        jobs.append(job)
    jobs.append({"job_name": "vllm-router", "metrics_path": "/metrics",
                 "static_configs": [{"targets": [f"127.0.0.1:{cfg.router_metrics_port}"], "labels": {"box": "front"}}]})
    return {"global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
            "rule_files": rule_files if rule_files is not None else [RULES_FILE],
            "scrape_configs": jobs}


def render(cfg: FleetConfig, rule_files: list[str] | None = None, interval_s: int = 15,
           token_dir: Path | None = None) -> str:
    head = ("# Written by `moet-panel fleet prometheus-config` (docs/fleet.md#one-dashboard): every box's panel\n"
            "# /metrics labelled box=NAME, and the router's exporter on the front's loopback.\n")
    # JSON is YAML (1.2): written with the stdlib, read by Prometheus as any YAML file
    return head + json.dumps(prometheus_config(cfg, rule_files, interval_s, token_dir), indent=2) + "\n"
