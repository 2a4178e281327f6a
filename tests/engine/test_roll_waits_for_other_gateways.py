"""A rolling switch takes a GPU out only once every other process's gateway sees another GPU serving
(app/backend/engine/gpus.py `_others_keep_serving`, answers.py `serving`): their view of the engine the roll just
booted lags by their own readiness probe, and a standalone gateway that saw only the GPU being taken out refused
every request meanwhile (3,630 refused in a loaded run of test_gateway_standalone_box.py)."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.engine.gpus import BoxGpus
from app.backend.engine.lifecycle.answers import AnswersPublisher, OtherPublishers, Published, file_of
from app.backend.engine.lifecycle.tickets import Ticket
from app.backend.files.jsonstore import JsonStore
from tests.polling import wait_for


class _Ctl:
    """An engine controller as the roll uses it: a snapshot, and a switch that is done at once."""

    def __init__(self, gpu: int, switched: list[tuple[int, list[list[int]]]], seen: Any) -> None:
        self.gpu, self.profile, self._switched, self._seen = gpu, "quality", switched, seen

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(state=EngineState.READY, profile_id=self.profile)

    def switch(self, profile_id: str, overrides: tuple[str, ...] = (), **_: object) -> Ticket:
        self._switched.append((self.gpu, self._seen()))  # what the other gateways saw as this GPU went out
        self.profile = profile_id
        t = Ticket(self.gpu, "switch", profile_id, True, ok=True)
        t._done.set()
        return t


def test_the_roll_takes_a_gpu_out_only_once_the_other_gateway_sees_another_serving() -> None:
    view = [[0, 1]]  # the other process's gateway: both serving at first
    switched: list[tuple[int, list[list[int]]]] = []
    box = BoxGpus({g: _Ctl(g, switched, lambda: [list(s) for s in view]) for g in (0, 1)},  # type: ignore[misc]
                  others_serving=lambda: [list(s) for s in view])

    def after_gpu0(gpu: int, _t: Ticket) -> None:
        if gpu == 0:
            view[0] = [1]  # GPU 0 is back as the roll sees it, not yet as the other gateway does
            threading.Timer(0.5, lambda: view.__setitem__(0, [0, 1])).start()  # its readiness probe catches up

    steps = box.rolling_switch("balanced", [0, 1], on_step=after_gpu0)
    assert [s.ok for s in steps] == [True, True]
    assert switched[0] == (0, [[0, 1]])
    assert switched[1] == (1, [[0, 1]])  # not taken out while the other gateway saw GPU 1 alone


def test_a_gateway_that_says_nothing_or_serves_nothing_does_not_hold_the_roll() -> None:
    switched: list[tuple[int, list[list[int]]]] = []
    for others in ([], [[]]):  # no publisher says; one that sends to no GPU (it refuses already: no wait helps)
        box = BoxGpus({g: _Ctl(g, switched, lambda o=others: o) for g in (0, 1)},  # type: ignore[misc]
                      others_serving=lambda o=others: o)  # type: ignore[misc]
        assert [s.ok for s in box.rolling_switch("balanced", [0, 1])] == [True, True]


def test_a_publisher_says_the_gpus_its_gateway_serves_and_another_process_reads_them(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    state_dir = tmp_path_factory.mktemp("home") / ".local" / "share" / "moet-panel" / "data" / ".moet-panel"
    state_dir.mkdir(parents=True, exist_ok=True)
    serving = [0, 1]
    pub = AnswersPublisher(state_dir, [], lambda: {0: 0, 1: 0}, lambda: list(serving))
    pub.start()
    try:
        wait_for(lambda: (JsonStore(pub.path, Published).read() or Published(0, 0, 0)).serving == [0, 1], 5,
                 "the GPUs served published")
        serving.remove(0)
        wait_for(lambda: (JsonStore(pub.path, Published).read() or Published(0, 0, 0)).serving == [1], 5,
                 "the change published")
    finally:
        pub.close()
    # another process's file (a live pid that is not ours: our parent) is read; our own is not
    other = state_dir / file_of(os.getppid())
    JsonStore(other, Published).write(Published(os.getppid(), 0, 0.0, {}, [1]))
    assert OtherPublishers(state_dir).serving() == [[1]]
