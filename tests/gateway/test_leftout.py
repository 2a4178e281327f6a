"""GPUs left out of the gateway by another process (a self-test or A/B in the panel) reach a `moet-panel gateway`
beside it (gateway/leftout.py; docs/gateway.md "One gateway"); its own, a dead writer's and a cleared note do not
count, and the one source both gateways use applies them (routing.box_source)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.files.jsonstore import JsonStore
from app.backend.gateway.engine_status import SnapshotSource
from app.backend.gateway.leftout import LeftOut, LeftOutNotes
from app.backend.gateway.routing import BoxSource, box_source


def test_another_live_processs_left_out_gpus_are_seen_and_its_own_or_a_dead_ones_are_not(tmp_path: Path) -> None:
    mine = LeftOutNotes(tmp_path)
    reader = LeftOutNotes(tmp_path)
    mine.publish({1})  # this process's own: its own fleet knows them already
    assert reader.others() == set()
    parent = os.getppid()
    JsonStore(tmp_path / f"left-out-{parent}.json", LeftOut).write(LeftOut(parent, [0, 2]))
    assert LeftOutNotes(tmp_path).others() == {0, 2}  # a fresh reader (the cache is per reader, 0.5 s)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    JsonStore(tmp_path / f"left-out-{dead.pid}.json", LeftOut).write(LeftOut(dead.pid, [3]))
    assert LeftOutNotes(tmp_path).others() == {0, 2}
    mine.close()
    assert not (tmp_path / f"left-out-{os.getpid()}.json").exists()


def test_box_source_is_the_one_engine_or_the_box_with_its_left_out_gpus() -> None:
    snaps = {g: EngineSnapshot(state=EngineState.READY, base_url=f"unix:/s/gpu{g}.sock", served_name="m")
             for g in (0, 1)}
    one = box_source([0], lambda g: lambda: snaps[g], lambda g: f"recipe-url-{g}")
    assert isinstance(one, SnapshotSource) and one.status().accepts and one.status().engines == ()
    assert box_source([0], lambda g: lambda: None, lambda g: f"recipe-url-{g}").status().base_url == "recipe-url-None"
    box = box_source([0, 1], lambda g: lambda: snaps[g], lambda g: f"recipe-url-{g}", left_out_fn=lambda: {0})
    assert isinstance(box, BoxSource)
    st = box.status()
    assert st.accepts and [(e.gpu, e.accepts) for e in st.engines] == [(0, False), (1, True)]
