"""The box facade (app/backend/engine/gpus.py) with fake controllers: GPU selection, start/stop on each GPU
named, and the rolling switch that takes one GPU at a time and stops at the first failure."""

from __future__ import annotations

from typing import cast

import pytest

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.engine.controller import EngineController
from app.backend.engine.gpus import BoxGpus, GpuSelectionError, build_box_gpus, parse_gpus
from app.backend.engine.lifecycle.tickets import Ticket


class FakeCtl:
    """The slice of EngineController the box uses; switches record when they ran and who else was ready."""

    log: list[tuple[str, int, list[int]]] = []

    def __init__(self, gpu: int, box_ref: list[BoxGpus], *, fails: bool = False) -> None:
        self.gpu, self.box_ref, self.fails = gpu, box_ref, fails
        self.snap = EngineSnapshot(state=EngineState.READY, profile_id="quality", base_url=f"unix:/s/e{gpu}.sock")
        self.closed = False
        self.builds: list[str | None] = []

    def snapshot(self) -> EngineSnapshot:
        return self.snap

    def _done(self, action: str, profile: str | None, ok: bool) -> Ticket:
        t = Ticket(1, action, profile, True, f"{action} {profile}")
        t.ok = ok
        t._done.set()
        return t

    def switch(self, profile_id: str, overrides=(), *, who: str = "", build: str | None = None) -> Ticket:
        self.builds.append(build)
        others_ready = [r.gpu for r in self.box_ref[0].rows() if r.gpu != self.gpu
                        and r.snapshot.state is EngineState.READY]
        FakeCtl.log.append(("switch", self.gpu, others_ready))
        if self.fails:
            self.snap = EngineSnapshot(state=EngineState.FAILED, profile_id=profile_id)
            return self._done("switch", profile_id, False)
        self.snap = EngineSnapshot(state=EngineState.READY, profile_id=profile_id, build=build or "")
        return self._done("switch", profile_id, True)

    def start(self, profile_id: str, overrides=(), *, who: str = "", build: str | None = None) -> Ticket:
        self.builds.append(build)
        self.snap = EngineSnapshot(state=EngineState.READY, profile_id=profile_id, build=build or "")
        return self._done("start", profile_id, True)

    def stop(self, *, who: str = "") -> Ticket:
        self.snap = EngineSnapshot(state=EngineState.STOPPED)
        return self._done("stop", None, True)

    def close(self) -> None:
        self.closed = True


def _box(n: int, failing: frozenset[int] = frozenset()) -> tuple[BoxGpus, dict[int, FakeCtl]]:
    ref: list[BoxGpus] = []
    ctls = {g: FakeCtl(g, ref, fails=g in failing) for g in range(n)}
    box = BoxGpus(cast(dict[int, EngineController], ctls))
    ref.append(box)
    FakeCtl.log = []
    return box, ctls


def test_gpu_selection() -> None:
    assert parse_gpus("all", [0, 1, 2]) == [0, 1, 2] and parse_gpus(None, [1, 0]) == [0, 1]
    assert parse_gpus("2,0,2", [0, 1, 2]) == [2, 0]
    for bad in ("3", "x", "0,,1", "-1"):
        with pytest.raises(GpuSelectionError, match="this box"):
            parse_gpus(bad, [0, 1, 2])


def test_one_gpu_box_is_the_one_engine_as_before() -> None:
    made: list[int | None] = []
    box = build_box_gpus(1, lambda gpu: made.append(gpu) or cast(EngineController, object()))
    assert made == [None] and box.gpus == [0]
    made.clear()
    assert build_box_gpus(3, lambda gpu: made.append(gpu) or cast(EngineController, object())).gpus == [0, 1, 2]
    assert made == [0, 1, 2]


def test_rolling_switch_takes_one_gpu_at_a_time_while_the_others_serve() -> None:
    box, ctls = _box(3)
    steps = box.rolling_switch("balanced", box.select("all"))
    assert [s.ok for s in steps] == [True, True, True]
    # each switch began while every other GPU was ready: never two down at once
    assert FakeCtl.log == [("switch", 0, [1, 2]), ("switch", 1, [0, 2]), ("switch", 2, [0, 1])]
    assert {c.snap.profile_id for c in ctls.values()} == {"balanced"}
    again = box.rolling_switch("balanced", [0, 1, 2])  # already there: nothing is taken away
    assert all(s.skipped for s in again) and len(FakeCtl.log) == 3


def test_rolling_switch_stops_at_the_first_failure() -> None:
    box, ctls = _box(3, failing=frozenset({1}))
    steps = box.rolling_switch("balanced", [0, 1, 2])
    assert [(s.gpu, s.ok, s.ticket is None) for s in steps] == [(0, True, False), (1, False, False), (2, False, True)]
    assert ctls[2].snap.profile_id == "quality" and ctls[2].snap.state is EngineState.READY  # GPU 2 still serves


def test_start_and_stop_each_gpu_named_and_rows() -> None:
    box, ctls = _box(2)
    box.stop([1])
    assert [r.as_dict()["state"] for r in box.rows()] == ["ready", "stopped"] and box.serving() == [0]
    box.start("quality", [1])
    assert box.serving() == [0, 1]
    assert box.rows()[0].as_dict()["listens"] == "unix:/s/e0.sock"
    box.close()
    assert all(c.closed for c in ctls.values())


def test_engine_tab_rows_one_per_gpu() -> None:
    from app.ui.engine import gpu_rows_html

    html = gpu_rows_html([(0, EngineSnapshot(state=EngineState.READY, profile_id="quality", base_url="unix:/a")),
                          (1, EngineSnapshot(state=EngineState.STARTING, profile_id="balanced"))], {1})
    assert html.count('data-testid="engine-gpu-row"') == 2
    assert 'data-gpu="1" data-state="starting"' in html and "left out of the gateway" in html


def test_host_share_for_n_engines_says_what_they_need_and_refuses_what_cannot_fit() -> None:
    from app.backend.engine.lifecycle.preflight import host_share
    from app.backend.contracts import docker_size_bytes
    from app.backend.recipe.loader import load_recipe
    from app.backend.config.settings import DEFAULT_RECIPE

    assert docker_size_bytes("32g") == 32 * 2**30 and docker_size_bytes("512m") == 512 * 2**20
    assert docker_size_bytes("") == 0 and docker_size_bytes("lots") == 0
    card = load_recipe(DEFAULT_RECIPE)
    own_shm = card.model_copy(update={"serve": card.serve.model_copy(update={"ipc": "", "shm_size": "32g"})})
    GB = 10**9
    ok = host_share(own_shm, 2, 256 * GB)
    assert ok.status == "pass" and "2 engines need: /dev/shm 64 GiB" in ok.detail and "shared" in ok.detail
    tight = host_share(own_shm, 2, 100 * GB)  # 2 × 64 GB floor > 100 GB: a miss on both at once would not fit
    assert tight.status == "warn"
    refused = host_share(own_shm, 4, 120 * GB)  # 4 × 32 GiB of /dev/shm > the host's RAM
    assert refused.status == "fail" and "fewer engines" in refused.fix


def test_chat_tab_names_the_gpu_on_a_box_of_several() -> None:
    from types import SimpleNamespace

    from app.ui.chat import endpoint_line

    class Chat:
        def endpoint(self, url):
            return SimpleNamespace(simulated=False, profile_id="quality", base_url="unix:/s/engine.sock",
                                   model="m", ready=True, reason="")

    assert "GPU" not in endpoint_line(cast(object, Chat()), "")[1]  # type: ignore[arg-type]
    assert "answered by GPU 0 (of 2)" in endpoint_line(cast(object, Chat()), "", 2)[1]  # type: ignore[arg-type]


def test_one_rolling_switch_at_a_time_from_the_engine_tab() -> None:
    import threading
    import time

    box, ctls = _box(2)
    gate, entered = threading.Event(), threading.Event()
    plain = FakeCtl.switch

    def held(self, profile_id, overrides=(), *, who="", build=None):
        entered.set()
        assert gate.wait(10)
        return plain(self, profile_id, overrides, who=who, build=build)

    ctls[0].switch = held.__get__(ctls[0])  # type: ignore[method-assign]
    assert "one GPU at a time" in box.start_rolling_switch("balanced", [0, 1])
    assert entered.wait(10)
    assert box.start_rolling_switch("speed", [0, 1]).startswith("refused")
    gate.set()
    deadline = time.monotonic() + 10
    while box.serving() != [0, 1] or ctls[1].snap.profile_id != "balanced":
        assert time.monotonic() < deadline, "the roll did not finish"
        gate.wait(0.01)


def test_a_self_test_result_names_its_gpu() -> None:
    from app.backend.selftest.report import to_markdown
    from app.backend.selftest.types import SelfTestResult

    r = SelfTestResult("quality", "img", "hash", "2026-12-04T22:00:00+00:00", True, 48.9, {}, gpu=1)
    back = SelfTestResult.from_json(r.to_json())
    assert back.gpu == 1 and "- GPU: 1" in to_markdown(back)
    one = SelfTestResult.from_json({**r.to_json(), "gpu": None})
    assert one.gpu is None and "GPU:" not in to_markdown(one)
    old = {k: v for k, v in r.to_json().items() if k != "gpu"}  # a result stored before issue 43
    assert SelfTestResult.from_json(old).gpu is None


def test_a_candidate_build_serves_on_one_gpu_while_the_others_keep_the_current_one() -> None:
    """Issue 45 on a box of several GPUs: `engine switch --gpu 1 --build next` rolls GPU 1 only, to that build; a
    GPU already on the profile but another build is switched, not skipped."""
    box, ctls = _box(3)
    steps = box.rolling_switch("quality", [1], build="next")
    assert [s.gpu for s in steps] == [1] and steps[0].ok and not steps[0].skipped
    assert ctls[1].builds == ["next"] and ctls[1].snapshot().build == "next"
    assert ctls[0].builds == ctls[2].builds == [] and ctls[0].snapshot().build == ""
    assert [t for _, t in box.start("balanced", [2], build="next")] and ctls[2].builds == ["next"]
