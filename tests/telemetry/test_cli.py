"""`moet-panel trace summarize` and `moet-panel telemetry --once` as a user runs them."""

from __future__ import annotations

import json

from app.backend.recipe import SIMULATED_RECIPE
from app.cli.main import main

from .conftest import FIXTURES


def test_trace_summarize_text(capsys) -> None:
    assert main(["trace", "summarize", str(FIXTURES / "freq_trace1_every64_469slots_top8.log")]) == 0
    out = capsys.readouterr().out
    assert "tick                3968" in out and "slots filled        469/469" in out
    assert "experts covered     469/11008 (4.3%)" in out and "pool coverage       46.5%" in out
    assert "window              +512/-512" in out and "cumulative          +31600/-31131" in out
    assert "alerts: none" in out


def test_trace_summarize_json_alerts(capsys) -> None:
    assert main(["trace", "summarize", str(FIXTURES / "churn_flat_24slots_trace1_every64_top8.log"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["summaries"] == 46 and r["ranks"][0]["last"]["tick"] == 2944
    f = r["ranks"][0]["file"]
    assert f["summaries"] == 46 and f["churn_per_s"] > 100 and f["span_s"] > 60
    assert [a["id"] for a in r["alerts"]] == ["churn_trap"]
    assert main(["trace", "summarize", str(FIXTURES / "disabled_auto_0slots_trace1_every64.log"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["sizing"]["disabled"] and [a["id"] for a in r["alerts"]] == ["pool_absent"]


def test_trace_summarize_missing_file_and_empty(capsys, tmp_path) -> None:
    assert main(["trace", "summarize", str(tmp_path / "nope.log")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["trace", "summarize", str(FIXTURES / "disabled_gb0_trace1_every64.log")]) == 0
    assert "0 lines, 0 summary lines" in capsys.readouterr().out


def test_telemetry_once_json_simulated(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("MOET_PANEL_GPU", "simulated")
    rc = main(["telemetry", "--once", "--json", "--interval", "0.1", "--data-dir", str(tmp_path),
               "--recipe", str(SIMULATED_RECIPE)])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["gpu"]["simulated"] and d["gpu"]["gpus"][0]["name"] == "RTX PRO 6000 (SIMULATED)"
    assert d["gpu"]["gpus"][0]["memory_total_gib"] == 96.0 and d["host"]["ram_total"] > 0


def test_telemetry_once_no_gpu_exit_1(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("MOET_PANEL_GPU", "none")
    rc = main(["telemetry", "--once", "--interval", "0.1", "--data-dir", str(tmp_path),
               "--recipe", str(SIMULATED_RECIPE)])
    out = capsys.readouterr().out
    assert rc == 1 and "GPU: GPU reading disabled" in out and "host: CPU" in out
