"""A demo panel that has something to say on every moet_panel_* family: the SIMULATED engine serving
(started, switched once), one real chat completion through the OpenAI client (the pool's trace lines),
and a self-test result in the store. Module-scoped: building it costs ~15 s."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import Panel, close_panel, engine_openai, free_port, launch_state

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "assets" / "monitoring"
NAME_RE = re.compile(r"\bmoet_panel_[a-z0-9_]+")


def scrape(url: str, **headers: str) -> httpx.Response:
    return httpx.get(url + "/metrics", headers=headers, timeout=10)


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name → [(labels, value)] as Prometheus' own text parser reads the exposition."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def poll(fn: Any, deadline_s: float, what: str) -> Any:
    """fn() until it returns something truthy; fails naming `what` after the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline_s:.0f} s waiting for {what}")
        time.sleep(0.2)


def used_names() -> dict[str, set[str]]:
    """Every moet_panel_* series the shipped rules and dashboard use, by file."""
    rules = yaml.safe_load((MONITORING / "alert-rules.yml").read_text())
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"]]
    dash = (MONITORING / "grafana-dashboard.json").read_text()
    import json

    dash_exprs = [t["expr"] for p in json.loads(dash)["panels"] for t in p["targets"]]
    return {"alert-rules.yml": set(NAME_RE.findall("\n".join(exprs))),
            "grafana-dashboard.json": set(NAME_RE.findall("\n".join(dash_exprs)))}


TEST_LABELS = {"moet-panel.test": "1"}


def isolated_panel(tmp: Path) -> Panel:
    """A demo panel whose simulated engine has a recipe id and a port of its own: other sessions' demo
    engines on this machine are never adopted, and teardown removes exactly this one's containers."""
    from app.backend.recipe import SIMULATED_RECIPE
    from app.backend.config.settings import resolve_settings
    from app.backend.state import build_app_state

    port = free_port()
    text = SIMULATED_RECIPE.read_text()
    assert text.count('id = "simulated"') == 1 and text.count("port = 8000") == 1
    # the copy lives elsewhere: its base recipe by absolute path
    text = text.replace('extends = "', f'extends = "{SIMULATED_RECIPE.parent}/')
    text = (text.replace('id = "simulated"', f'id = "simtest-metrics-{port}"').replace("port = 8000", f"port = {port}")
                .replace('"--port", "8000"', f'"--port", "{port}"'))
    recipe = tmp / "simulated-metrics.toml"
    recipe.write_text(text)
    settings = resolve_settings(recipe, tmp / "data", demo=True)
    settings.ensure_state_dir()
    state = build_app_state(settings)
    state.engine.options.extra_labels = dict(TEST_LABELS)
    return launch_state(state)


def close_isolated(panel: Panel) -> None:
    """Stop the engine, close the panel, remove this recipe's containers (only those)."""
    recipe_id = panel.state.settings.recipe.id
    try:
        panel.state.engine.stop().wait(60)
    finally:
        close_panel(panel)
        import docker

        try:
            client = docker.from_env()
        except docker.errors.DockerException:  # the SIMULATED process runtime: nothing to remove
            return
        for c in client.containers.list(all=True, filters={"label": "moet-panel.test=1"}):
            if c.labels.get("moet-panel.recipe") == recipe_id:
                c.remove(force=True)


@dataclass
class Live:
    panel: Panel
    text: str  # a scrape once everything above has happened


def _save_selftest(panel: Panel) -> None:
    from app.backend.selftest.types import DecodeRun, SelfTestResult

    store = panel.state.selftest.store
    runs = [DecodeRun(tok_s=v, tokens=256, ttft_s=0.2, metrics_tok_s=v) for v in (47.9, 48.3, 48.1)]
    store.save(SelfTestResult(profile_id="quality", image_id="sha256:sim", recipe_hash="h", date="2026-12-01T10:00:00+00:00",
                              simulated=True, card_decode_tok_s=48.9, plan={}, decode=runs))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    panel = isolated_panel(tmp_path_factory.mktemp("metrics"))
    engine = panel.state.engine
    engine.options.extra_env = {"MOET_SIM_BOOT_S": "1"}  # the engine tests' 1 s boot (a start and a switch here)
    try:
        _save_selftest(panel)
        assert engine.start("balanced").wait(180), "the simulated engine did not finish booting"
        assert engine.switch("quality").wait(180), "the switch did not finish"
        snap = engine.snapshot()
        assert snap.is_ready and snap.profile_id == "quality", snap
        # the panel's gateway on, one keyed request through it: its series (gwmetrics.py) are exported too
        gateway = panel.state.gateway
        assert gateway is not None and gateway.start(port=free_port()).state.value == "on"
        key = gateway.create_key("scrape-test").key
        with openai.OpenAI(base_url=gateway.snapshot().url + "/v1", api_key=key, max_retries=0, timeout=60) as gw:
            gw.chat.completions.create(model=snap.served_name, max_tokens=3, messages=[{"role": "user", "content": "hi"}])
        with engine_openai(snap.base_url, timeout=60) as client:  # over the engine's socket (issue 40)

            def covered() -> str | None:
                """One more real completion (the engine prints a pool summary every 64 steps), then a scrape."""
                client.chat.completions.create(model=snap.served_name, max_tokens=400,
                                               messages=[{"role": "user", "content": "Write a haiku about GPUs."}])
                text = scrape(panel.url).text
                wanted = ("moet_panel_pool_coverage_ratio{", "moet_panel_pool_replacements_per_second{",
                          "moet_panel_gateway_requests_total{")
                return text if all(w in text for w in wanted) else None

            text = poll(covered, 90, "the pool's coverage and churn in /metrics")
        yield Live(panel, text)
    finally:
        close_isolated(panel)
