"""Preflight and diagnosis say what the card says: the single-GPU limit only where more than one GPU is
visible; host RAM below ~64 GB flagged as the cache-miss OOM threshold, not as a serving requirement."""

from __future__ import annotations

from pathlib import Path

from app.backend.engine.logs.diagnosis import classify
from app.backend.engine.lifecycle.preflight import PreflightInputs, run_preflight
from app.backend.recipe import DEFAULT_RECIPE, load_recipe
from app.backend.telemetry.gpu_sim import FakeGpuReader
from app.backend.contracts import GpuSample

GIB = 2**30
RECIPE = load_recipe(DEFAULT_RECIPE)


def _gpu(index: int) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index}", name="NVIDIA RTX PRO 6000 Blackwell", compute_capability=(12, 0),
                     memory_total=int(95.6 * GIB), memory_used=int(0.3 * GIB), memory_reserved=0, ecc_current=False,
                     processes=())


def _items(tmp_path: Path, gpus: int, recipe=RECIPE) -> dict[str, object]:
    inp = PreflightInputs(recipe=recipe, env=dict(recipe.serve.env), data_dir=tmp_path, runtime=None,
                          runtime_error="daemon down", gpu_reader=FakeGpuReader([[_gpu(i) for i in range(gpus)]]))
    return {i.id: i for i in run_preflight(inp).items}


def test_multi_gpu_limit_is_stated_only_when_more_than_one_gpu_is_visible(tmp_path: Path) -> None:
    two = _items(tmp_path, 2)
    item = two["gpu_count"]
    assert "2 GPUs visible" in item.detail and "will not work on a multi-GPU split" in item.fix
    assert "gpu_count" not in _items(tmp_path, 1)


def test_host_ram_below_the_card_threshold_is_worded_as_the_cache_miss_risk(tmp_path: Path) -> None:
    req = RECIPE.requirements.model_copy(update={"host_ram_gb": 10_000})  # every test host is below it
    item = _items(tmp_path, 1, RECIPE.model_copy(update={"requirements": req}))["host_ram"]
    assert item.status == "warn" and "planes-cache miss would OOM-kill this host" in item.detail
    assert "recipe:" not in item.detail and "less than ~64 GB of RAM" in item.fix


def test_diagnosis_no_longer_claims_what_the_card_does_not_say() -> None:
    oom = classify(1, False, ["torch.OutOfMemoryError: CUDA out of memory"])
    assert "beyond 7" not in oom.fix and "10 GiB does not fit at 256K" in oom.fix
    v2 = classify(1, False, ["ValueError: VLLM_MOE_W2 is not integrated with Model Runner V2"])
    assert "forces V2" not in v2.explanation and "mutually exclusive" in v2.explanation
    assert "N-gram spec decode does boot" in v2.fix
