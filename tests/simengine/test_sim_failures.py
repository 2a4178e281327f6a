"""Failure modes selected by MOET_SIM_FAIL, in-process and as a real process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from app.backend.simengine import config_from_env_and_args

from .conftest import TIER_RE, free_port_local, http_status, messages, poll, summaries

PKG_PARENT = Path(__file__).resolve().parents[2] / "app" / "backend"


def test_oom_at_load_prints_torch_error_and_exits_1(make_sim):
    sim = make_sim(fail="oom_at_load", ready=False)
    assert sim.wait(10) == 1
    text = "\n".join(sim.captured)
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.69 GiB. GPU 0 has a total capacity" in text
    assert "EngineCore failed to start." in text
    assert "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s):" in text
    assert text.index("EngineCore failed to start.") < text.index("RuntimeError: Engine core initialization")
    assert "Application startup complete." not in text
    with pytest.raises(httpx.ConnectError):
        httpx.get(sim.base_url + "/health", timeout=2)


def test_crash_mid_generation_cuts_the_stream(make_sim):
    sim = make_sim(fail="crash_mid_generation", crash_after_tokens=10)
    with openai.OpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY", max_retries=0) as c:
        stream = c.chat.completions.create(model="deepseek-v4-flash", messages=[{"role": "user", "content": "x"}],
                                           stream=True, max_tokens=500, extra_body={"ignore_eos": True})
        received = 0
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            for _chunk in stream:
                received += 1
    assert 1 <= received <= 12
    assert sim.wait(5) == 1
    assert any(m == "EngineCore encountered a fatal error." for m in messages(sim.captured))
    with pytest.raises(httpx.ConnectError):
        httpx.get(sim.base_url + "/health", timeout=2)


def test_pool_disabled_boots_healthy_without_ticks(make_sim):
    sim = make_sim(fail="pool_disabled", decode_tok_s=3000.0, env={"VLLM_MOE_W2_DELTA_TRACE_EVERY": "4"})
    assert http_status(sim.base_url + "/health") == 200
    msgs = messages(sim.captured)
    assert ("moe_w2 delta tier AUTO: 2.37 GiB free after KV < reserve 3.0 GiB -> pool disabled "
            "(0 slots, pure 2-bit; host store released)") in msgs
    assert not any(TIER_RE.match(m) for m in msgs)  # only the "auto-sizing deferred" line, no pool
    with openai.OpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY", max_retries=0) as c:
        c.completions.create(model="deepseek-v4-flash", prompt="x", max_tokens=50, extra_body={"ignore_eos": True})
    assert summaries(sim.captured) == []


def test_slow_boot_takes_ten_times_longer(make_sim):
    sim = make_sim(fail="slow_boot", boot_s=0.2, ready=False)
    assert http_status(sim.base_url + "/health") == 503
    assert not sim.wait_ready(0.5)  # the normal boot would be done by now
    assert sim.wait_ready(10)


def test_health_turns_200_after_loading(make_sim):
    sim = make_sim(boot_s=0.5, ready=False)
    assert http_status(sim.base_url + "/health") == 503
    assert http_status(sim.base_url + "/v1/models") == 503
    poll(lambda: http_status(sim.base_url + "/health") == 200, timeout=10)
    assert "INFO:     Application startup complete." in sim.captured


def test_host_oom_in_process_reports_137(make_sim):
    sim = make_sim(fail="host_oom", ready=False)
    assert sim.wait(10) == 137
    msgs = messages(sim.captured)
    assert sum(m.endswith("planes built (1.69 GiB)") for m in msgs) == 18


def _run_module(env_extra: dict[str, str], port: int) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(PKG_PARENT), "MOET_SIM_BOOT_S": "0.05", **env_extra}
    return subprocess.run([sys.executable, "-m", "simengine", "--port", str(port), "--unknown-flag", "x"],
                          env=env, capture_output=True, text=True, timeout=30)


def test_module_process_exit_codes():
    oom = _run_module({"MOET_SIM_FAIL": "oom_at_load"}, free_port_local())
    assert oom.returncode == 1
    assert "torch.OutOfMemoryError" in oom.stderr + oom.stdout
    killed = _run_module({"MOET_SIM_FAIL": "host_oom"}, free_port_local())
    assert killed.returncode == -signal.SIGKILL


def test_module_stops_cleanly_on_sigterm():
    port = free_port_local()
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(PKG_PARENT), "MOET_SIM_BOOT_S": "0.05"}
    proc = subprocess.Popen([sys.executable, "-m", "simengine", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        poll(lambda: _status_or_zero(f"http://127.0.0.1:{port}/health") == 200, timeout=15)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _status_or_zero(url: str) -> int:
    try:
        return http_status(url, timeout=1)
    except OSError:
        return 0


def test_bad_fail_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="MOET_SIM_FAIL='explode' is not one of"):
        config_from_env_and_args([], {"MOET_SIM_FAIL": "explode"})
