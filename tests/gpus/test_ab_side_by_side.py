"""A blind A/B on two GPUs at once (issue 43): A on one engine, B on another, no switch between them; the GPUs
are left out of the gateway while they measure and taken back after."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import cast

from app.backend.abtest.journal import Journal, new_spec
from app.backend.abtest.runner import ABRunService
from app.backend.config.settings import resolve_settings
from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.engine.controller import EngineController
from app.backend.jobs import JobState
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.selftest.probe import EngineProbe, Timing


class Engine:
    def __init__(self, profile: str, url: str) -> None:
        self.snap = EngineSnapshot(state=EngineState.READY, profile_id=profile, base_url=url)
        self.switches = 0

    def snapshot(self) -> EngineSnapshot:
        return self.snap

    def profiles(self) -> list:
        class P:
            def __init__(self, i: str) -> None:
                self.id = i

        return [P("quality"), P("balanced")]

    def switch(self, profile: str):  # the side-by-side run must never call it here
        self.switches += 1
        raise AssertionError("no switch expected")


class Probe:
    """Both sides generate at once: each waits (with a deadline) until the other side has begun."""

    started: dict[str, threading.Event] = {}

    def __init__(self, url: str) -> None:
        self.url = url

    def generate(self, messages, max_tokens, *, seed=None, cancel=None, **kw) -> Timing:
        side = "A" if self.url.endswith("a") else "B"
        Probe.started[side].set()
        other = Probe.started["B" if side == "A" else "A"]
        assert other.wait(10), "the other side never ran at the same time"
        return Timing(0.01, 0.1, 5, 3, f"{side} answer {seed}", "stop")


def test_a_and_b_generate_at_once_on_two_gpus_with_no_switch(tmp_path: Path) -> None:
    a, b = Engine("quality", "unix:/s/a"), Engine("balanced", "unix:/s/b")
    Probe.started = {"A": threading.Event(), "B": threading.Event()}
    told: list[bool] = []
    settings = resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)  # the builds' registry reads its recipe
    svc = ABRunService(settings, cast(EngineController, a),
                       probe_factory=lambda url: cast(EngineProbe, Probe(url)),
                       engine_for=lambda side: cast(EngineController, a if side == "A" else b),
                       on_sides=told.append)
    spec = new_spec("quality", "balanced", ["one", "two"], [1, 2], 64)
    svc.start(spec)
    p = svc.wait(30)
    assert p.state is JobState.DONE, p.message
    assert a.switches == b.switches == 0 and told == [True, False]
    st = Journal(settings.ensure_state_dir()).load(spec.run_id)
    assert st.generated == 8 and {g.text.split()[0] for g in st.gens.values() if g.side == "A"} == {"A"}
    assert {g.text.split()[0] for g in st.gens.values() if g.side == "B"} == {"B"}


def test_the_panel_service_puts_a_run_on_the_gpus_it_names(tmp_path: Path) -> None:
    """The Compare tab's "A runs on / B runs on": the service knows every GPU's engine and a run names two; those
    GPUs are left out of the gateway while it runs (on_gpus), and a GPU not on the box is refused before anything
    is journalled."""
    a, b = Engine("quality", "unix:/s/a"), Engine("balanced", "unix:/s/b")
    Probe.started = {"A": threading.Event(), "B": threading.Event()}
    told: list[tuple[bool, tuple[int, ...]]] = []
    settings = resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)
    svc = ABRunService(settings, cast(EngineController, a), probe_factory=lambda url: cast(EngineProbe, Probe(url)),
                       engines={0: cast(EngineController, a), 1: cast(EngineController, b)},
                       on_gpus=lambda on, gpus: told.append((on, gpus)))
    assert svc.gpus == [0, 1]
    journal = Journal(settings.ensure_state_dir())
    try:
        svc.start(new_spec("quality", "balanced", ["one"], [1], 64), gpus=(0, 5))
        raise AssertionError("GPU 5 is not on this box")
    except ValueError as exc:
        assert "GPUs 0 and 5" in str(exc) and "it has 0, 1" in str(exc)
    assert journal.runs() == []  # refused before anything was journalled
    spec = new_spec("quality", "balanced", ["one", "two"], [1], 64)
    try:  # both GPUs of a two-GPU box: no GPU would serve; asked for, not assumed (issue 49)
        svc.start(spec, gpus=(0, 1))
        raise AssertionError("a run on every GPU must be asked for")
    except ValueError as exc:
        assert "leave no GPU of this box serving" in str(exc) and "Take every GPU out of service" in str(exc)
    assert journal.runs() == []
    svc.start(spec, gpus=(0, 1), every_gpu=True)
    p = svc.wait(30)
    assert p.state is JobState.DONE, p.message
    assert a.switches == b.switches == 0 and told == [(True, (0, 1)), (False, (0, 1))]
    st = journal.load(spec.run_id)
    assert {g.text.split()[0] for g in st.gens.values() if g.side == "B"} == {"B"}  # B's answers came from GPU 1


class SwitchingEngine(Engine):
    """An engine that switches at once and records its switches (and when, beside the gateway's calls)."""

    def __init__(self, profile: str, url: str, log: list[str], name: str) -> None:
        super().__init__(profile, url)
        self.log, self.name = log, name

    def switch(self, profile: str, build: str | None = None, who: str = "") -> object:  # type: ignore[override]
        self.switches += 1
        self.snap = EngineSnapshot(state=EngineState.READY, profile_id=profile, base_url=self.snap.base_url)
        self.log.append(f"{self.name}->{profile}")

        class Ticket:
            accepted, message = True, ""

            @staticmethod
            def wait(timeout: float | None = None) -> bool:
                return True

        return Ticket()

    def wait_for(self, pred, timeout: float) -> EngineSnapshot:
        assert pred(self.snap)
        return self.snap


class AnyProbe:
    def __init__(self, url: str) -> None:
        self.url = url

    def generate(self, messages, max_tokens, *, seed=None, cancel=None, **kw) -> Timing:
        return Timing(0.01, 0.1, 5, 3, f"answer {seed}", "stop")


def _two_gpu_service(tmp_path: Path, e0: Engine, e1: Engine, log: list[str]) -> ABRunService:
    settings = resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)
    return ABRunService(settings, cast(EngineController, e0), probe_factory=lambda url: cast(EngineProbe, AnyProbe(url)),
                        engines={0: cast(EngineController, e0), 1: cast(EngineController, e1)},
                        on_gpus=lambda on, gpus: log.append(f"{'out' if on else 'back'}:{gpus}"))


def test_by_default_one_gpu_keeps_serving_and_the_gpu_measured_comes_back_to_its_profile(tmp_path: Path) -> None:
    """Issue 49: A and B taking turns on GPU 1 leave GPU 0 serving; GPU 1 served quality before the run, so it
    serves quality after it (switched back before it goes back into the gateway)."""
    log: list[str] = []
    e0, e1 = SwitchingEngine("balanced", "unix:/s/0", log, "gpu0"), SwitchingEngine("quality", "unix:/s/1", log, "gpu1")
    svc = _two_gpu_service(tmp_path, e0, e1, log)
    assert not svc.takes_every_gpu((1, 1)) and svc.takes_every_gpu((0, 1))
    svc.start(new_spec("quality", "balanced", ["one"], [1], 64), gpus=(1, 1))
    p = svc.wait(30)
    assert p.state is JobState.DONE, p.message
    assert log == ["out:(1,)", "gpu1->balanced", "gpu1->quality", "back:(1,)"], log
    assert e0.switches == 0 and e1.snapshot().profile_id == "quality"


def test_after_a_run_on_every_gpu_each_comes_back_to_its_own_profile(tmp_path: Path) -> None:
    log: list[str] = []
    e0, e1 = SwitchingEngine("balanced", "unix:/s/0", log, "gpu0"), SwitchingEngine("quality", "unix:/s/1", log, "gpu1")
    svc = _two_gpu_service(tmp_path, e0, e1, log)
    svc.start(new_spec("quality", "balanced", ["one"], [1], 64), gpus=(0, 1), every_gpu=True)
    p = svc.wait(30)
    assert p.state is JobState.DONE, p.message
    assert log[0] == "out:(0, 1)" and log[-1] == "back:(0, 1)", log
    assert sorted(log[1:3]) == ["gpu0->quality", "gpu1->balanced"] and log[3:5] == ["gpu0->balanced", "gpu1->quality"]
    assert (e0.snapshot().profile_id, e1.snapshot().profile_id) == ("balanced", "quality")
