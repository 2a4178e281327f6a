"""`moet-panel chat` as a subprocess against the SIMULATED engine."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "app", "chat", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, input=stdin, timeout=60)


def test_cli_streams_reasoning_answer_and_stats(sim) -> None:
    r = run_cli("--base-url", sim.base_url, "--max-tokens", "60", "--system", "Be brief.", "hello there")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.split()) >= 50  # thinking + answer words on stdout
    assert re.search(r"TTFT \d+\.\d\d s · \d+\.\d tok/s · \d+→60 tokens · \d+\.\d s · hit max tokens", r.stderr), r.stderr
    params = sim.stats.last_params
    assert params["max_tokens"] == 60 and params["min_p"] == 0.05 and params["temperature"] == 1.0


def test_cli_reads_stdin_and_warns_on_temperature_zero(sim) -> None:
    r = run_cli("--base-url", sim.base_url, "--max-tokens", "5", "--temperature", "0", "-", stdin="from stdin")
    assert r.returncode == 0, r.stderr
    assert "Never temperature=0 on a reasoning model" in r.stderr
    assert sim.stats.last_params["temperature"] == 0


def test_cli_says_clearly_when_nothing_listens() -> None:
    r = run_cli("--base-url", "http://127.0.0.1:9", "hi")
    assert r.returncode == 1
    assert "nothing is answering at http://127.0.0.1:9" in r.stderr and "--base-url" in r.stderr
    assert "Traceback" not in r.stderr
