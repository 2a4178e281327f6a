"""A self-test on one GPU of a box of several (issue 43): it measures the engine of the GPU it names, the result
names that GPU, that GPU is left out of the gateway while it runs, and a GPU that does not serve the profile (or
is not on the box) is refused with why."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from app.backend.config.settings import resolve_settings
from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.engine.controller import EngineController
from app.backend.jobs import JobState
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.selftest.probe import EngineProbe, Timing
from app.backend.selftest.runner import SelfTestService
from app.backend.selftest.types import SelfTestPlan


class Engine:
    def __init__(self, profile: str, url: str) -> None:
        self.snap = EngineSnapshot(state=EngineState.READY if profile else EngineState.STOPPED, profile_id=profile,
                                   base_url=url)
        self.runtime = None

    def snapshot(self) -> EngineSnapshot:
        return self.snap

    def busy(self) -> None:
        return None

    def run_spec(self, profile_id: str, build: str | None = None):
        raise KeyError(profile_id)  # identity unknown: fine for this test


class Probe:
    urls: list[str] = []

    def __init__(self, url: str) -> None:
        Probe.urls.append(url)

    def generation_tokens_total(self) -> float | None:
        return None

    def generate(self, messages, max_tokens, **kw) -> Timing:
        return Timing(0.05, 1.0, max_tokens, 10, "x" * max_tokens, "length")


def test_a_self_test_measures_the_gpu_it_names(tmp_path: Path) -> None:
    settings = resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)
    gpu0, gpu1, gpu2 = Engine("balanced", "unix:/s/gpu0"), Engine("quality", "unix:/s/gpu1"), Engine("", "")
    told: list[tuple[bool, int | None]] = []
    Probe.urls = []
    svc = SelfTestService(settings, cast(EngineController, gpu0), probe_factory=lambda url: cast(EngineProbe, Probe(url)),
                          on_run=lambda on, gpu: told.append((on, gpu)), gpu=0,
                          engines={0: cast(EngineController, gpu0), 1: cast(EngineController, gpu1),
                                   2: cast(EngineController, gpu2)})
    plan = SelfTestPlan("quality", runs=1, decode_tokens=50, ttft_lengths=(), needle_lengths=())
    assert "GPU 0" not in svc.check("quality", gpu=1) and svc.check("quality", gpu=1) == ""
    assert "serves profile balanced, not quality" in svc.check("quality")  # GPU 0's engine serves balanced
    assert "the engine on GPU 2 is stopped" in svc.check("quality", gpu=2)
    assert "GPU 7 is not one of this box's (0, 1, 2)" in svc.check("quality", gpu=7)
    refused = svc.start(plan, gpu=2)
    assert refused.state is JobState.FAILED and "GPU 2" in refused.message and told == []
    svc.start(plan, gpu=1)
    p = svc.wait(30)
    assert p.state is JobState.DONE, p.message
    assert p.result is not None and p.result.gpu == 1 and Probe.urls == ["unix:/s/gpu1"]
    assert told == [(True, 1), (False, 1)]  # GPU 1 left out of the gateway while it measured, then taken back
