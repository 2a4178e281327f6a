"""The shipped Grafana dashboard's `box` variable (docs/fleet.md#one-dashboard): every selector of every panel carries
`box=~"$box"`, and its All value (`.*`) matches a series without a `box` label, so one box alone (no fleet, no label)
shows everything as before. The regex semantics are Prometheus' own, checked with promtool's PromQL engine."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .conftest import MONITORING

DASHBOARD = MONITORING / "grafana-dashboard.json"
BOX = 'box=~"$box"'
# names followed by something other than a selector: aggregators (`sum by (x) (...)`), binary and modifier keywords
AGGREGATORS = {"sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values",
               "group"}
KEYWORDS = {"by", "on", "without", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in items:
        yield p
        yield from panels(p.get("panels", []))  # a row's own panels


def exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in panels(dash["panels"]) for t in p.get("targets", [])]


def selectors(expr: str) -> list[tuple[str, str]]:
    """(metric name, the matchers between its braces, "" when none) of every vector selector of a PromQL
    expression: names that are not functions, aggregators, keywords or inside a label list, a range or a string."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == '"':
            i = expr.index('"', i + 1) + 1
            continue
        if c == "[":  # a range or a subquery's duration
            i = expr.index("]", i) + 1
            continue
        m = NAME.match(expr, i)
        if m is None or (i and (expr[i - 1].isalnum() or expr[i - 1] in "_.")):
            i += 1
            continue
        name, j = m.group(0), m.end()
        rest = expr[j:].lstrip()
        if name in KEYWORDS:
            i = expr.index(")", j) + 1 if rest.startswith("(") else j  # `by (a, b)`: label names, not series
        elif rest.startswith("(") or name in AGGREGATORS:
            i = j
        elif rest.startswith("{"):
            k = expr.index("{", j)
            end = expr.index("}", k)
            out.append((name, expr[k + 1:end]))
            i = end + 1
        else:
            out.append((name, ""))
            i = j
    return out


def test_the_selector_finder_finds_what_it_should() -> None:
    """The finder above is what the next test trusts: shown on the shapes the dashboard uses."""
    assert selectors('histogram_quantile(0.95, sum by (le) (rate(a_bucket{x="1"}[5m])))') == [("a_bucket", 'x="1"')]
    assert selectors("b * on (box, model_name) group_left c{y!=\"z\"} > 0") == [("b", ""), ("c", 'y!="z"')]
    assert selectors("increase(vllm:d_total[1h]) / (e > 0) * 60") == [("vllm:d_total", ""), ("e", "")]


def test_every_panel_selector_carries_the_box_matcher() -> None:
    found = [(e, name, m) for e in exprs() for name, m in selectors(e)]
    assert len(found) >= 40  # every panel's series: a dashboard that lost its queries fails here
    missing = [(e, name) for e, name, m in found if BOX not in m]
    assert not missing, f"selectors without {BOX}: {missing}"


def test_the_box_variable_lists_the_boxes_and_its_all_matches_everything() -> None:
    dash = json.loads(DASHBOARD.read_text())
    var = next(v for v in dash["templating"]["list"] if v["name"] == "box")
    assert var["type"] == "query" and var["datasource"]["uid"] == "${datasource}"
    assert var["definition"] == "label_values(moet_panel_build_info, box)" == var["query"]["query"]
    # Grafana's own All is a regex of the values it listed: none on one box alone (no `box` label), which would
    # match nothing; `.*` matches every value and the empty one, i.e. a series without the label (next test)
    assert var["includeAll"] is True and var["allValue"] == ".*"
    assert var["current"]["value"] == ["$__all"]


def test_all_matches_a_series_without_a_box_label_in_prometheus(tmp_path: Path) -> None:
    """promtool evaluates with Prometheus' engine: a label matcher's regex is anchored (RE2, `^(?:…)$`) and a missing
    label reads as "", which `.*` matches: `{box=~".*"}` keeps a one-box series without `box`. A multi-value
    selection (Grafana writes `(box1|box3)`) keeps those boxes and drops a series without the label."""
    (tmp_path / "none.yml").write_text("groups: []\n")
    case = {"rule_files": ["none.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": 'moet_panel_engine_ready{job="moet-panel", model_name="m"}', "values": "1 1"},
                         {"series": 'moet_panel_engine_ready{job="moet-panel", model_name="m", box="box1"}', "values": "1 1"},
                         {"series": 'moet_panel_engine_ready{job="moet-panel", model_name="m", box="box2"}', "values": "0 0"}],
        "promql_expr_test": [
            {"expr": 'moet_panel_engine_ready{box=~".*"}', "eval_time": "1m", "exp_samples": [
                {"labels": 'moet_panel_engine_ready{job="moet-panel", model_name="m"}', "value": 1},
                {"labels": 'moet_panel_engine_ready{job="moet-panel", model_name="m", box="box1"}', "value": 1},
                {"labels": 'moet_panel_engine_ready{job="moet-panel", model_name="m", box="box2"}', "value": 0}]},
            {"expr": 'moet_panel_engine_ready{box=~"(box1|box3)"}', "eval_time": "1m", "exp_samples": [
                {"labels": 'moet_panel_engine_ready{job="moet-panel", model_name="m", box="box1"}', "value": 1}]},
        ]}]}
    (tmp_path / "box.test.yml").write_text(json.dumps(case))  # JSON is YAML
    r = subprocess.run(["promtool", "test", "rules", str(tmp_path / "box.test.yml")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def targets() -> list[dict[str, Any]]:
    dash = json.loads(DASHBOARD.read_text())
    return [t for p in panels(dash["panels"]) for t in p.get("targets", [])]


def test_every_legend_names_the_box_and_no_aggregation_merges_boxes() -> None:
    """With All over several boxes each line says whose it is (Grafana renders a missing label as "": one box alone
    reads as before), and a `sum by (…)` keeps `box`, so two boxes are two lines, not one sum."""
    for t in targets():
        assert "{{box}}" in t.get("legendFormat", "{{box}}"), t
        for labels in re.findall(r"\bby \(([^)]*)\)", t["expr"]):
            assert "box" in [s.strip() for s in labels.split(",")], t["expr"]


def test_the_decode_and_quantile_panels_keep_one_series_per_box_in_prometheus(tmp_path: Path) -> None:
    """The panels that aggregate, evaluated by promtool over two boxes: one result per box, each labelled."""
    decode = next(t["expr"] for t in targets() if "vllm:generation_tokens_total" in t["expr"]).replace("$box", ".*")
    ttft = next(t["expr"] for t in targets() if t.get("legendFormat", "").startswith("TTFT p95")).replace("$box", ".*")
    (tmp_path / "none.yml").write_text("groups: []\n")
    series = [{"series": f'vllm:generation_tokens_total{{model_name="m", box="{b}"}}', "values": f"0+{r}x10"}
              for b, r in (("a", 600), ("b", 1200))]
    series += [{"series": f'moet_panel_gateway_ttft_seconds_bucket{{le="{le}", box="{b}"}}', "values": f"0+{n}x10"}
               for b in ("a", "b") for le, n in (("0.5", 6 if b == "a" else 0), ("1", 6), ("+Inf", 6))]
    case = {"rule_files": ["none.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m", "input_series": series,
        "promql_expr_test": [
            {"expr": decode, "eval_time": "5m", "exp_samples": [
                {"labels": '{model_name="m", box="a"}', "value": 10},
                {"labels": '{model_name="m", box="b"}', "value": 20}]},
            {"expr": ttft, "eval_time": "5m", "exp_samples": [
                {"labels": '{box="a"}', "value": 0.475},
                {"labels": '{box="b"}', "value": 0.975}]},
        ]}]}
    (tmp_path / "agg.test.yml").write_text(json.dumps(case))
    r = subprocess.run(["promtool", "test", "rules", str(tmp_path / "agg.test.yml")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
