"""Diagnosis is a pure function over (exit code, OOMKilled, log tail): every class from its text."""

from __future__ import annotations

import pytest

from app.backend.engine.logs.diagnosis import classify

TRACEBACK_TAIL = [
    "(APIServer pid=1) ERROR 08-22 14:03:11 [core.py:700] EngineCore failed to start.",
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3/dist-packages/vllm/v1/engine/core.py", line 690, in run_engine_core',
] + [f'  File "frame{i}.py", line {i}, in f' for i in range(60)] + [
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of "
         "94.97 GiB", "cuda_oom_at_load"),
        ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization`", "cuda_oom_at_load"),
        ("ValueError: moe_w2 RESIDENT planes do not fit: 43 MoE layers x 1.69 GiB = 72.6 GiB of 2-bit planes vs "
         "~70.1 GiB", "boot_guard"),
        ("ValueError: VLLM_MOE_W2_GATE=1 but no FP4 delta tier exists (VLLM_MOE_W2_DELTA_GB unset/0) — the gate "
         "cannot recover precision.", "boot_guard"),
        ("ValueError: moe_w2 FP4 need-pool is below the FIRE FLOOR: 100 slots < 1204", "boot_guard"),
        ("ValueError: VLLM_MOE_W2 is not integrated with Model Runner V2 (mandatory base replay and gate hooks)", "model_runner_v2"),
        ("ERROR: [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): address already in use", "port_in_use"),
        ("OSError: /model does not appear to have a file named config.json.", "missing_model_files"),
        ("ERROR moe_w2_cubit unavailable: sm_120-only cubins; this device reports sm_90", "wrong_gpu"),
    ],
)
def test_root_cause_found_above_a_long_traceback(line: str, reason: str) -> None:
    lines = ["INFO boot", line] + TRACEBACK_TAIL
    d = classify(1, False, lines)
    assert d.reason == reason
    assert line.strip() in d.evidence
    assert d.title and d.explanation and d.fix


def test_cuda_oom_fix_cites_the_card() -> None:
    d = classify(1, False, ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"])
    assert "nvidia-smi -e 0" in d.fix and "expandable_segments" in d.fix


def test_oomkilled_flag_is_host_oom_even_without_log_lines() -> None:
    d = classify(137, True, [])
    assert d.reason == "host_oom_kill"
    assert "VLLM_MOE_W2_CKPT_ID" in d.fix


def test_exit_137_with_cache_miss_is_host_oom_with_staging_explanation() -> None:
    lines = ["(EngineCore_DP0 pid=1) INFO 11-30 04:00:00 [moe_w2_cubit.py:1785] moe_w2: layer 0 planes built (1.69 GiB)"]
    d = classify(137, False, lines, cache_miss=True)
    assert d.reason == "host_oom_kill"
    assert "51 GiB" in d.explanation


def test_plain_sigkill_is_killed_not_oom() -> None:
    d = classify(137, False, ["INFO:     Application startup complete."])
    assert d.reason == "killed"
    assert "137" in d.title


def test_cache_miss_without_kill_is_identity_miss() -> None:
    d = classify(1, False, ["moe_w2: layer 3 planes built (1.69 GiB)", "something else failed"], cache_miss=True)
    assert d.reason == "cache_identity_miss"
    assert "meta.json" in d.fix


def test_unknown_exit_keeps_the_tail_as_evidence() -> None:
    d = classify(3, False, ["a", "b", "weird failure"])
    assert d.reason == "unexpected_exit"
    assert "3" in d.title
    assert d.evidence[-1] == "weird failure"


def test_hint_pool_not_loaded_carries_the_card_warning() -> None:
    line = ("moe_w2 delta tier AUTO: 2.37 GiB free after KV < reserve 3.0 GiB -> pool disabled (0 slots, pure 2-bit; "
            "host store released)")
    d = classify(None, False, [line], hint="pool_not_loaded")
    assert d.reason == "pool_not_loaded"
    assert d.title == "failed: pool not loaded"
    assert "4.96/30" in d.explanation and "decoheres" in d.explanation
    assert d.evidence  # the pool-disabled line is quoted


def test_image_missing_from_docker_text() -> None:
    assert classify(None, False, ["404 Client Error: Not Found (\"No such image: vllm-moet-sm120:v026\")"]).reason == "image_missing"


def test_clean_shutdown_outside_the_panel_is_not_called_a_crash() -> None:
    lines = ["(APIServer pid=1) INFO: 127.0.0.1:1 - GET /metrics 200 OK", "INFO:     Shutting down",
             "INFO:     Waiting for application shutdown.", "INFO:     Finished server process [1]"]
    d = classify(0, False, lines)
    assert d.reason == "stopped_outside_panel"
    assert "Shutting down" in " ".join(d.evidence)
    assert classify(0, False, ["some other line"]).reason == "unexpected_exit"
