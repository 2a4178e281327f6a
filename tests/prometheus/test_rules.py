"""The shipped alert rules: Prometheus' promtool checks them and runs their unit tests; every rule has a
case where it fires and one where it stays quiet; their thresholds are the panel's own (alerts.py, the
recipe), so the two never disagree."""

from __future__ import annotations

import json
import re
import subprocess

import yaml

from app.backend.web.auth import LoginThrottle
from app.backend.recipe import DEFAULT_RECIPE
from app.backend.recipe.loader import load_recipe
from app.backend.selftest import drift
from app.backend.alerts import rules as alerts

from .conftest import MONITORING

RULES = MONITORING / "alert-rules.yml"
TESTS = MONITORING / "tests"


def _rules() -> dict[str, dict]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def test_promtool_check_rules() -> None:
    r = _promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in r.stdout


def test_promtool_check_config_of_the_shipped_scrape_config() -> None:
    r = _promtool("check", "config", str(MONITORING / "prometheus.yml"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_unit_tests_pass() -> None:
    files = sorted(TESTS.glob("*.yml"))
    assert files
    r = _promtool("test", "rules", *map(str, files))
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_rule_has_a_firing_and_a_quiet_unit_test() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for f in TESTS.glob("*.yml"):
        for t in yaml.safe_load(f.read_text())["tests"]:
            for case in t.get("alert_rule_test", []):
                (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    rules = set(_rules())
    assert not rules - fires, f"rules never shown firing: {sorted(rules - fires)}"
    assert not rules - quiet, f"rules never shown quiet: {sorted(rules - quiet)}"
    assert not (fires | quiet) - rules, "tests for rules that do not exist"


def _numbers(expr: str) -> str:
    return re.sub(r"\s+", " ", expr)


def test_thresholds_are_the_panels_own() -> None:
    r = {name: _numbers(rule["expr"]) for name, rule in _rules().items()}
    assert f">= {alerts.CHURN_GIB_S:g} * 2^30" in r["MoetPoolChurnTrap"]
    assert f">= {alerts.CHURN_TURNOVER_PER_S:g}" in r["MoetPoolChurnTrap"]
    assert f"> {alerts.VRAM_FULL_FRACTION:g}" in r["MoetVramAbove98Percent"]
    assert f"< {alerts.HOST_RAM_LOW_BYTES // 2**30} * 2^30" in r["MoetHostRamLow"]
    assert f"< {alerts.HOST_RAM_LOW_FRACTION:g}" in r["MoetHostRamLow"]
    assert f">= {alerts.ZERO_COVERAGE_SUMMARIES}" in r["MoetPoolEmptyWhileServing"]
    assert f"< on (box, model_name) {1 - drift.DRIFT_FRACTION:g} *" in r["MoetDecodeBelowCard"]
    assert _rules()["MoetDecodeBelowCard"]["for"] == f"{drift.DRIFT_WINDOW_S:g}s"
    assert f"> {LoginThrottle().free_client}" in r["MoetLoginFailures"]
    recipe = load_recipe(DEFAULT_RECIPE)
    assert _rules()["MoetEngineBootTooLong"]["for"] == f"{recipe.engine.boot_timeout_s // 60}m"
    for name in ("THERMAL", "POWER"):
        for reason in getattr(alerts, name):
            assert reason in r["MoetGpuThermalThrottling" if name == "THERMAL" else "MoetGpuPowerThrottling"]


def test_the_pool_absent_rule_quotes_the_cards_score() -> None:
    recipe = load_recipe(DEFAULT_RECIPE)
    study = next(s for s in recipe.studies if s.id == "study1-recovery")
    none_row = next(row for row in study.rows if str(row[0]).startswith("no FP4 recovery"))
    score = none_row[1].text  # 4.96
    for name in ("MoetPoolAbsent", "MoetPoolEmptyWhileServing"):
        assert f"the card measured {score}/30 for this" in _rules()[name]["annotations"]["description"]


def test_the_dashboards_reference_lines_are_the_cards() -> None:
    dash = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    by_title = {p["title"]: p for p in dash["panels"]}
    assert all(t.endswith("?") for t in by_title), "one panel per question an operator asks"

    def line(title: str) -> float:
        steps = by_title[title]["fieldConfig"]["defaults"]["thresholds"]["steps"]
        return float(steps[-1]["value"])

    recipe = load_recipe(DEFAULT_RECIPE)
    quality = next(p for p in recipe.profiles if p.id == "quality")
    assert any("~57%" in n for n in quality.notes)  # the card's coverage figure
    assert line("Is the FP4 pool doing its job?") == 0.57
    assert line("Is the pool thrashing?") == alerts.CHURN_GIB_S * 2**30
    exprs = " ".join(t["expr"] for t in by_title["Does decode reach the card's figure?"]["targets"])
    assert "moet_panel_card_decode_tokens_per_second" in exprs and "vllm:generation_tokens_total" in exprs
    assert "moet_panel_card_vram_bytes" in json.dumps(by_title["Will VRAM run out?"]["targets"])
