"""Three artifacts at once (the card's model / planescache / store) against the SIMULATED hub: every
tree byte-identical, one artifact's failure keeps the others, kill -9 with all three mid-way, a
full disk pauses them all, cancel, hostile archive in one of them, the shared connection budget."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.backend.download.budget import ConnectionBudget, shares
from app.backend.download.group import RunGroup
from app.backend.download.segments import SegmentQueue
from app.backend.download.progress import ProgressBoard
from app.backend.download.runner import artifact_jobs, run_download
from app.backend.download.types import (
    ArtifactState, CorruptPartError, SpaceError, StateChanged, StopSignal, Stopped, UnsafeArchiveError,
)
from app.backend.recipe.schema import ArtifactSpec
from app.backend.simhub.artifacts import (
    TreeSpec, build_artifact, build_hostile_artifact, file_digest_tree, generate_tree, reference_extract,
)
from app.backend.simhub.faults import Fault
from app.backend.simhub.server import SimHub

from .conftest import PART_SIZE, fast_config
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
REPO = "moet-panel/simulated-cache"
LAYERS = {"model": 2, "planescache": 3, "store": 4}  # the card's proportions, roughly (156 : 202 : 339)


@dataclass(frozen=True)
class Three:
    files: dict[str, Path]
    parts: dict[str, list[Path]]
    reference: dict[str, dict[str, tuple[str, int]]]  # artifact -> its tree's digests (paths under its top)
    specs: list[ArtifactSpec]


def spec(art: str) -> ArtifactSpec:
    return ArtifactSpec(id=art, prefix=f"{art}.tar.zst.part.", yields=art, extracted_gib=0.001, contents="test")


@pytest.fixture(scope="session")
def three() -> Iterator[Three]:
    tmp = Path(tempfile.mkdtemp(prefix="moet-dl-three-"))
    try:
        files, parts, reference = {}, {}, {}
        for i, (art, layers) in enumerate(LAYERS.items()):
            generate_tree(tmp / "src", TreeSpec(top=art, layers=layers, file_size=256 * 1024,
                                                sparse_size=(8 << 20) if art == "planescache" else 0,
                                                ckpt_id="sim-ckpt" if art == "planescache" else None, seed=10 + i))
            parts[art] = build_artifact(tmp / "src", art, tmp / "repo", f"{art}.tar.zst.part.", PART_SIZE)
            reference_extract(parts[art], tmp / "ref" / art)
            reference[art] = file_digest_tree(tmp / "ref" / art)
            files.update({p.name: p for p in parts[art]})
        yield Three(files, parts, reference, [spec(a) for a in LAYERS])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def hub_for(three: Three, files: dict[str, Path] | None = None, **kw) -> SimHub:
    hub = SimHub(**kw)
    hub.add_repo(REPO, files or three.files)
    return hub.start()


def hold_last_parts(hub: SimHub, three: Three) -> None:
    """Each artifact's last part trickles (1 byte, then a dropped connection; a byte moved, so the downloader
    keeps retrying): no artifact can finish until `hub.faults.clear()`, however slowly a loaded box starts
    its processes. Without this, the smallest one could be done before the largest had begun (CI)."""
    for parts in three.parts.values():
        assert len(parts) >= 2, "the held part must not be the only one"
        hub.add_fault(parts[-1].name, Fault("stall", times=-1, after_bytes=1, stall_s=0.2))


def trees_of(dest: Path, arts: list[str]) -> dict[str, dict[str, tuple[str, int]]]:
    tree = file_digest_tree(dest)
    return {art: {k: v for k, v in tree.items() if k == art or k.startswith(art + "/")} for art in arts}


def journal(dest: Path, art: str) -> dict | None:
    try:
        return json.loads((dest / f".moet-panel/downloads/{art}.json").read_text())
    except (OSError, ValueError):
        return None


def test_three_at_once_each_tree_byte_identical_and_all_three_overlap(settings, three, tmp_path):
    hub = hub_for(three, rate_cap_bps=2_000_000)
    hold_last_parts(hub, three)  # however slowly a loaded box starts the processes, none ends before all began
    dest = tmp_path / "dest"
    board, stop = ProgressBoard(), threading.Event()
    try:
        cfg = fast_config(settings, hub.endpoint, dest, artifact_jobs=3, connections=3)
        worker, outcome = start_under_way(cfg, three.specs, board, stop)
        hub.faults.clear()
        worker.join(60)
        assert not worker.is_alive() and not outcome, outcome
    finally:
        stop.set()
        hub.stop()
    snap = {a.id: a for a in board.snapshot()}
    assert all(a.state == ArtifactState.DONE for a in snap.values()), {a.id: a.reason for a in snap.values()}
    assert trees_of(dest, list(LAYERS)) == three.reference
    # all three were under way before the first one finished: they ran side by side
    changes = [e for e in board.events if isinstance(e, StateChanged)]
    first_done = next(i for i, e in enumerate(changes) if e.state == ArtifactState.DONE)
    started = {e.artifact for e in changes[:first_done] if e.state == ArtifactState.DOWNLOADING}
    assert started == set(LAYERS), started
    disk = board.disk()
    assert disk is not None and disk.staging_peak > 0, "peak staging is reported"
    assert all(a.decoded_bytes == a.total_bytes for a in snap.values()), "every compressed byte went through the decoder"
    # each artifact's first part was resolved once, by the panel's process: its artifact process used that answer
    firsts = [three.parts[a][0].name for a in LAYERS]
    assert [hub.stats.requests[("resolve", name)] for name in firsts] == [1, 1, 1]


def test_one_artifact_failing_keeps_the_others(settings, three, tmp_path):
    bad = three.parts["model"][0].name
    hub = hub_for(three)
    hub.add_fault(bad, Fault("corrupt", offset=1000, times=-1))
    dest = tmp_path / "dest"
    board = ProgressBoard()
    try:
        with pytest.raises(CorruptPartError, match=bad):
            run_download(fast_config(settings, hub.endpoint, dest, artifact_jobs=3, corrupt_refetches=1),
                         three.specs, board, threading.Event())
    finally:
        hub.stop()
    snap = {a.id: a for a in board.snapshot()}
    assert snap["model"].state == ArtifactState.FAILED and bad in snap["model"].reason
    assert snap["planescache"].state == snap["store"].state == ArtifactState.DONE
    assert journal(dest, "store")["state"] == journal(dest, "planescache")["state"] == "done"
    ref = trees_of(dest, ["planescache", "store"])
    assert ref == {k: three.reference[k] for k in ("planescache", "store")}


def test_hostile_archive_in_one_artifact_is_refused_the_others_complete(settings, three, tmp_path):
    hostile = build_hostile_artifact("dotdot", tmp_path / "hostile", "store.tar.zst.part.")
    files = {k: v for k, v in three.files.items() if not k.startswith("store.")}
    files.update({p.name: p for p in hostile})
    hub = hub_for(three, files)
    dest = tmp_path / "dest"
    board = ProgressBoard()
    try:
        with pytest.raises(UnsafeArchiveError):
            run_download(fast_config(settings, hub.endpoint, dest, artifact_jobs=3), three.specs, board,
                         threading.Event())
    finally:
        hub.stop()
    snap = {a.id: a for a in board.snapshot()}
    assert snap["store"].state == ArtifactState.FAILED and "refused" in snap["store"].reason
    assert snap["model"].state == snap["planescache"].state == ArtifactState.DONE
    assert not (tmp_path / "evil.txt").exists() and not (dest.parent / "evil.txt").exists()


def test_cancel_marks_every_artifact_cancelled_and_resume_completes(settings, three, tmp_path):
    hub = hub_for(three)
    hold_last_parts(hub, three)
    dest = tmp_path / "dest"
    board, stop = ProgressBoard(), StopSignal()
    cfg = fast_config(settings, hub.endpoint, dest, artifact_jobs=3, connections=3)
    worker, outcome = start_under_way(cfg, three.specs, board, stop)
    try:
        stop.request(cancel=True)
        worker.join(30)
        assert outcome and isinstance(outcome[0], Stopped)
        for a in board.snapshot():
            assert a.state == ArtifactState.CANCELLED and a.eta_s is None, (a.id, a.state)
            assert journal(dest, a.id)["state"] == "cancelled"
        hub.faults.clear()
        board = ProgressBoard()
        run_download(cfg, three.specs, board, threading.Event())
        snap = board.snapshot()
        assert all(a.state == ArtifactState.DONE for a in snap)
        assert all(a.reused_parts >= 1 and "reuses" in _began_reason(board, a.id) for a in snap)
        assert trees_of(dest, list(LAYERS)) == three.reference
    finally:
        stop.set()
        worker.join(30)
        hub.stop()


def start_under_way(cfg, specs: list[ArtifactSpec], board: ProgressBoard,
                    stop: threading.Event) -> tuple[threading.Thread, list[BaseException]]:
    """run_download in a thread, returned once all three artifacts have verified bytes."""
    outcome: list[BaseException] = []

    def work() -> None:
        try:
            run_download(cfg, specs, board, stop)
        except BaseException as exc:  # noqa: BLE001 - checked by the caller
            outcome.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    deadline = time.monotonic() + 30
    while not (len(board.ids()) == 3 and all(a.verified_bytes for a in board.snapshot())):
        if time.monotonic() > deadline or not worker.is_alive():
            stop.set()
            worker.join(30)
            raise AssertionError(("never got all three under way", outcome))
        time.sleep(0.05)
    return worker, outcome


def test_a_part_waiting_to_retry_leaves_its_connection_to_another_artifact(settings, three, tmp_path):
    """One connection for two artifacts; the store's first request is answered 429 Retry-After 60. While
    the store waits, the model takes the connection and completes: a worker holds no slot while it
    waits to retry. Before, it held the slot through the wait, so an artifact with none yet could not
    start until the other's part went through (the cancel test's "never got all three under way" under
    load: the late artifact's process found every slot held by the others' trickling last parts)."""
    store, model = three.specs[2], three.specs[0]
    hub = hub_for(three)
    hub.add_fault(three.parts["store"][0].name, Fault("ratelimit", retry_after=60))
    board, stop = ProgressBoard(), threading.Event()
    cfg = fast_config(settings, hub.endpoint, tmp_path / "dest", artifact_jobs=2, connections=1)
    outcome: list[BaseException] = []

    def work() -> None:
        try:
            run_download(cfg, [store, model], board, stop)
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    worker = threading.Thread(target=work)
    worker.start()
    try:
        wait_for(lambda: len(board.ids()) == 2 and board.state("model") == ArtifactState.DONE or outcome,
                   timeout=40, what="the model did not complete while the store waited to retry")
        assert not outcome, outcome
        assert hub.stats.cdn_requests(three.parts["store"][0].name) >= 1, "the store was answered 429"
        assert board.state("store") != ArtifactState.DONE, "the store still waits for its Retry-After"
    finally:
        stop.set()
        worker.join(30)
        hub.stop()
    assert not worker.is_alive()


def _began_reason(board: ProgressBoard, art: str) -> str:
    return next(e.reason for e in board.events if isinstance(e, StateChanged) and e.artifact == art
                and e.state == ArtifactState.DOWNLOADING)


KILLABLE = """
import json, sys, threading
from pathlib import Path
from dataclasses import replace
from app.backend.download.config import make_config
from app.backend.download.progress import ProgressBoard
from app.backend.download.runner import run_download
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.recipe.schema import ArtifactSpec
from app.backend.config.settings import resolve_settings
endpoint, dest, specs = sys.argv[1], Path(sys.argv[2]), [ArtifactSpec(**s) for s in json.loads(sys.argv[3])]
settings = resolve_settings(SIMULATED_RECIPE, dest, demo=True)
cfg = replace(make_config(settings, endpoint=endpoint, dest=dest), artifact_jobs=3, connections=3,
              segment_size=128 * 1024, reserve_bytes=0)
run_download(cfg, specs, ProgressBoard(), threading.Event())
"""


@pytest.mark.slow
def test_kill_9_with_all_three_mid_way_then_resume(settings, three, tmp_path):
    dest = tmp_path / "dest"
    hub = hub_for(three)
    hold_last_parts(hub, three)
    try:
        specs = json.dumps([s.model_dump() for s in three.specs])
        proc = subprocess.Popen([sys.executable, "-c", KILLABLE, hub.endpoint, str(dest), specs], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60

        def mid_way(art: str) -> bool:
            state = journal(dest, art)
            if not state:
                return False
            busy = sum(p["status"] in ("verified", "consumed") for p in state["parts"])
            return 1 <= busy < len(state["parts"])

        while not all(mid_way(a) for a in LAYERS):
            assert time.monotonic() < deadline, "never had all three mid-way"
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        before = {a: journal(dest, a) for a in LAYERS}
        verified = [p["name"] for j in before.values() for p in j["parts"] if p["status"] in ("verified", "consumed")]
        assert all(j["state"] in ("downloading", "verifying", "extracting") for j in before.values())
        served = {p: hub.stats.cdn_bytes[p] for p in verified}
        hub.faults.clear()
        board = ProgressBoard()
        run_download(fast_config(settings, hub.endpoint, dest, artifact_jobs=3), three.specs, board, threading.Event())
        for p in verified:
            assert hub.stats.cdn_bytes[p] == served[p], f"verified part {p} was downloaded again"
        assert all(a.state == ArtifactState.DONE for a in board.snapshot())
        assert trees_of(dest, list(LAYERS)) == three.reference
        assert not list(dest.rglob("*.moet-partial"))
    finally:
        hub.stop()


@pytest.fixture
def tmpfs(small_tmpfs):
    return small_tmpfs


def test_disk_full_pauses_all_three_then_resume_completes(settings, three, tmpfs):
    hub = hub_for(three)
    dest = tmpfs / "dest"
    try:
        board = ProgressBoard()
        cfg = fast_config(settings, hub.endpoint, dest, artifact_jobs=3)
        with pytest.raises(SpaceError):
            run_download(cfg, three.specs, board, threading.Event())
        for a in board.snapshot():
            assert a.state in (ArtifactState.PAUSED, ArtifactState.DONE), (a.id, a.state, a.reason)
            if a.state == ArtifactState.PAUSED:
                assert "disk full" in a.reason or "not enough disk" in a.reason, a.reason
                assert a.eta_s is None
        assert any(a.state == ArtifactState.PAUSED for a in board.snapshot())
        for art in LAYERS:
            for name, size in (journal(dest, art) or {"files_done": {}})["files_done"].items():
                assert (dest / name).stat().st_size == size
        subprocess.run(["mount", "-o", "remount,size=96m", str(tmpfs)], check=True)
        board = ProgressBoard()
        run_download(cfg, three.specs, board, threading.Event())
        assert all(a.state == ArtifactState.DONE for a in board.snapshot())
        assert trees_of(dest, list(LAYERS)) == three.reference
    finally:
        hub.stop()


def test_urgent_requests_take_a_freed_connection_first():
    budget, halt = ConnectionBudget(1), threading.Event()
    assert budget.acquire(lambda: False, halt)
    order: list[str] = []

    def take(name: str, urgent: bool) -> None:
        assert budget.acquire(lambda: urgent, halt)
        order.append(name)
        budget.release()

    ahead = threading.Thread(target=take, args=("read-ahead", False))
    ahead.start()
    urgent = threading.Thread(target=take, args=("urgent", True))
    urgent.start()
    wait_for(lambda: budget.urgent_waiting == 1)  # the urgent request is queued
    budget.release()
    ahead.join(5)
    urgent.join(5)
    assert order == ["urgent", "read-ahead"]
    assert budget.acquire(lambda: True, halt)  # the one slot is free again
    halt.set()
    assert budget.acquire(lambda: True, halt) is False, "a halted run stops waiting for a slot"


def served_order(budget: ConnectionBudget, halt: threading.Event, requests: list[tuple[str, bool, int]],
                 free_rank: int) -> list[str]:
    """Queue (name, urgent, rank) requests on a full budget one after another, free one slot of
    `free_rank`, and return the order they were served in (each gives its slot back once served)."""
    order: list[str] = []

    def take(name: str, urgent: bool, rank: int) -> None:
        assert budget.acquire(lambda: urgent, halt, rank)
        order.append(name)
        budget.release(rank)

    waiters = [threading.Thread(target=take, args=args) for args in requests]
    for i, t in enumerate(waiters):
        t.start()
        wait_for(lambda n=i + 1: budget.waiting == n)  # queued before the next one comes
    budget.release(free_rank)
    for t in waiters:
        t.join(5)
    return order


def test_connections_are_shared_in_proportion_to_the_bytes_left_to_fetch():
    """The card's sizes: 24 connections split 12 : 7 : 5. An artifact below its share goes first,
    even with read-ahead against another's urgent request: on a saturated link its share of the
    requests in flight is its share of the link (docs/downloads.md, "Sharing the link")."""
    assert shares(24, [1830, 1070, 760]) == [12, 7, 5]
    assert shares(2, [30, 10, 1]) == [1, 1, 1], "at least one each"
    budget, halt = ConnectionBudget(4, ranks=2, weights=[300, 100]), threading.Event()
    for rank in (0, 0, 0, 1):  # both at their share: 3 and 1
        assert budget.acquire(lambda: False, halt, rank)
    order = served_order(budget, halt, [("small urgent", True, 1), ("store read-ahead", False, 0)],
                         free_rank=0)  # the store is below its share again
    assert order == ["store read-ahead", "small urgent"]


def _hold_every_slot_then_wait(budget: ConnectionBudget) -> None:
    """An artifact's process (rank 0): takes every slot, queues one more urgent request, is killed."""
    never = threading.Event()
    for _ in range(budget.size):
        assert budget.acquire(lambda: False, never)
    threading.Thread(target=budget.acquire, args=(lambda: True, never), daemon=True).start()
    never.wait()


def test_a_killed_artifact_process_gives_back_its_slots_and_queued_requests():
    from app.backend.download import forkserver

    budget = ConnectionBudget(2, ranks=2)
    child = forkserver.context().Process(target=_hold_every_slot_then_wait, args=(budget,))
    child.start()
    try:
        wait_for(lambda: budget.urgent_waiting == 1, timeout=30)  # holds both and waits for a third
    finally:
        child.kill()
        child.join(10)
    halted = threading.Event()
    halted.set()  # one look, no waiting
    assert budget.acquire(lambda: False, halted, rank=1) is False, "the dead process still holds everything"
    budget.forget(0)  # what run_in_child does when a child ends without a word
    assert budget.waiting == 0
    assert budget.acquire(lambda: False, halted, rank=1) and budget.acquire(lambda: False, halted, rank=1)


def _die_holding_the_lock(budget: ConnectionBudget, held: Any) -> None:
    budget._lock.acquire()  # noqa: SLF001 - the moment a kill can land: inside a critical section
    held.set()
    threading.Event().wait()


def test_a_lock_held_by_a_killed_process_is_taken_over(monkeypatch):
    from app.backend.download import forkserver

    monkeypatch.setattr(ConnectionBudget, "TAKE_OVER_S", 0.2)
    ctx = forkserver.context()
    budget, held = ConnectionBudget(2, ranks=2), ctx.Event()
    child = ctx.Process(target=_die_holding_the_lock, args=(budget, held))
    child.start()
    try:
        assert held.wait(30)
    finally:
        child.kill()
        child.join(10)
    budget.forget(0)
    got: list[bool] = []
    halted = threading.Event()
    halted.set()
    taker = threading.Thread(target=lambda: got.append(budget.acquire(lambda: False, halted, rank=1)), daemon=True)
    taker.start()
    taker.join(10)
    assert got == [True], "the lock the dead process held was never given back"


def test_a_waiting_read_ahead_request_becomes_urgent_when_its_extractor_reaches_it():
    budget, halt = ConnectionBudget(1), threading.Event()
    assert budget.acquire(lambda: False, halt)
    reached = threading.Event()  # the extractor of the waiting request's artifact reached its part
    got: list[str] = []
    waiter = threading.Thread(target=lambda: budget.acquire(reached.is_set, halt) and got.append("it"))
    waiter.start()
    other = threading.Thread(target=lambda: budget.acquire(lambda: True, halt) and got.append("other"))
    other.start()
    wait_for(lambda: budget.urgent_waiting == 1)  # only the other one is urgent yet
    reached.set()
    budget.poke()
    wait_for(lambda: budget.urgent_waiting == 2)  # asked again while it waits
    budget.release()
    budget.release()
    waiter.join(5)
    other.join(5)
    assert sorted(got) == ["it", "other"]
    assert budget.urgent_waiting == 0


def _overlap_run(settings, three: Three, dest: Path, monkeypatch, hold_s: float) -> dict[str, dict[str, Any]]:
    """One artifact at a time (a 2-core box), model's end held until planescache starts or `hold_s` passes.
    Returns, per artifact, what the board said of the others when it started."""
    from app.backend.download.job import ArtifactRun

    started: dict[str, dict[str, Any]] = {}
    run, complete = ArtifactRun.run, ArtifactRun._complete

    def recording_run(self: ArtifactRun) -> None:
        started[self.plan.id] = {a.id: a for a in self.board.snapshot()}
        run(self)

    def held_complete(self: ArtifactRun) -> None:
        if self.plan.id == "model":  # model has every part and extracted them: its decoder's tail
            deadline = time.monotonic() + hold_s
            while "planescache" not in started and time.monotonic() < deadline:
                time.sleep(0.01)
        complete(self)

    monkeypatch.setattr(ArtifactRun, "run", recording_run)
    monkeypatch.setattr(ArtifactRun, "_complete", held_complete)
    hub = hub_for(three)
    board = ProgressBoard()
    try:
        run_download(fast_config(settings, hub.endpoint, dest, artifact_jobs=1), three.specs, board, threading.Event())
    finally:
        hub.stop()
    assert all(a.state == ArtifactState.DONE for a in board.snapshot())
    assert trees_of(dest, list(LAYERS)) == three.reference
    return started


def test_the_next_artifact_starts_once_the_previous_has_every_part(settings, three, tmp_path, monkeypatch):
    started = _overlap_run(settings, three, tmp_path / "dest", monkeypatch, hold_s=10.0)
    model = started["planescache"]["model"]
    assert model.state != ArtifactState.DONE, "planescache waited for model's end: the network idled meanwhile"
    assert model.fetched_bytes == model.total_bytes, "planescache started while model was still fetching"
    assert started["planescache"]["store"].state == ArtifactState.QUEUED


def test_no_early_start_without_disk_room_for_its_first_part(settings, three, tmp_path, monkeypatch):
    from app.backend.download import runner

    monkeypatch.setattr(runner, "free_bytes", lambda path: 0)  # only the launcher's check: not the preflight
    started = _overlap_run(settings, three, tmp_path / "dest", monkeypatch, hold_s=1.5)
    assert started["planescache"]["model"].state == ArtifactState.DONE


def test_concurrency_follows_the_cores(settings, monkeypatch):
    from app.backend.download import runner

    cfg = fast_config(settings, "http://127.0.0.1:9", Path("/tmp/x"))
    monkeypatch.setattr(runner, "available_cores", lambda: 2)
    assert artifact_jobs(cfg, 3) == 1, "a 2-core box runs one artifact at a time, as before"
    monkeypatch.setattr(runner, "available_cores", lambda: 16)
    assert artifact_jobs(cfg, 3) == 3
    assert artifact_jobs(cfg, 1) == 1
    from dataclasses import replace

    assert artifact_jobs(replace(cfg, artifact_jobs=2), 3) == 2


def test_board_mirror_carries_counters_state_and_each_event_once():
    """A child's board, exported twice, lands in the parent's with every event exactly once."""
    from app.backend.download.statemachine import Began, ExtractingParts
    from app.backend.download.types import ArtifactProgress, Notice

    child, parent = ProgressBoard(), ProgressBoard()
    for board in (child, parent):
        board.register(ArtifactProgress(id="store", total_bytes=100))
    child.apply("store", Began(""))
    child.add_verified("store", 40)
    child.set_staging("store", used=40, budget=100, free=1000, needed=60, path="/d")
    first, cursor = child.export("store", 0)
    parent.mirror(first)
    child.apply("store", ExtractingParts())
    child.event(Notice("store", message="resumed"))
    second, cursor = child.export("store", cursor)
    parent.mirror(second)
    again, _ = child.export("store", cursor)
    parent.mirror(again)  # nothing new: no event twice
    snap = {a.id: a for a in parent.snapshot()}["store"]
    assert snap.state == ArtifactState.EXTRACTING and snap.verified_bytes == 40 and snap.parts_verified == 1
    assert [type(e).__name__ for e in parent.events] == ["StateChanged", "StateChanged", "Notice"]
    disk = parent.disk()
    assert disk is not None and disk.staging_used == 40 and disk.staging_budget == 100


def test_an_artifact_process_killed_from_outside_fails_only_that_artifact(settings, three, tmp_path):
    import psutil

    hub = hub_for(three)
    hold_last_parts(hub, three)
    dest = tmp_path / "dest"
    board = ProgressBoard()
    cfg = fast_config(settings, hub.endpoint, dest, artifact_jobs=3, connections=3)
    worker, outcome = start_under_way(cfg, three.specs, board, threading.Event())
    try:
        me = psutil.Process()
        server = next(p for p in me.children() if "forkserver" in " ".join(p.cmdline()))
        victims = server.children()
        assert len(victims) == 3, ("one process per artifact", [(a.id, a.state.value) for a in board.snapshot()])
        victims[0].kill()  # the OOM killer, say
        hub.faults.clear()
        worker.join(60)
        assert outcome and "ended unexpectedly" in str(outcome[0]), outcome
        states = sorted(a.state.value for a in board.snapshot())
        assert states == ["done", "done", "failed"], states
        failed = next(a for a in board.snapshot() if a.state == ArtifactState.FAILED)
        assert "Resume continues" in failed.reason
        board = ProgressBoard()
        run_download(cfg, three.specs, board, threading.Event())  # Resume: the killed one completes
        assert all(a.state == ArtifactState.DONE for a in board.snapshot())
        assert trees_of(dest, list(LAYERS)) == three.reference
    finally:
        worker.join(30)
        hub.stop()


def test_requests_go_urgent_first_then_largest_artifact_first():
    """Urgent before read-ahead; within each, rank 0 (the largest artifact, whose chain bounds the run)
    before rank 1: the store's read-ahead goes before the small artifact's, after its urgent request."""
    budget, halt = ConnectionBudget(1, ranks=2), threading.Event()
    assert budget.acquire(lambda: False, halt)
    order = served_order(budget, halt, [("small read-ahead", False, 1), ("store read-ahead", False, 0),
                                        ("small", True, 1), ("store", True, 0)], free_rank=0)
    assert order == ["store", "small", "store read-ahead", "small read-ahead"]
    assert budget.waiting == 0


def store_alone(settings: Any, three: Three, tmp_path: Path, connections: int) -> tuple[SimHub, int]:
    """Download the store alone into tmp_path/dest; it must end done. The (stopped) hub keeps its record of
    the ranges it served; the segment size is returned beside it."""
    hub = hub_for(three)
    board = ProgressBoard()
    try:
        cfg = fast_config(settings, hub.endpoint, tmp_path / "dest", artifact_jobs=1, connections=connections)
        run_download(cfg, [s for s in three.specs if s.id == "store"], board, threading.Event())
    finally:
        hub.stop()
    assert board.snapshot()[0].state == ArtifactState.DONE, board.snapshot()[0].reason
    return hub, cfg.segment_size


def test_segments_are_fetched_lowest_first_when_workers_outnumber_the_slots(settings, three, tmp_path, monkeypatch):
    """A worker waits for a connection slot before it takes a segment, so each freed slot goes to the lowest
    segment still to fetch and parts complete in order. When each waiting worker held its segment, a freed
    slot went to whichever woke first (docs/downloads.md, "In order")."""
    built = RunGroup.__init__

    def four_workers(self: RunGroup, *args: Any, **kw: Any) -> None:
        built(self, *args, **kw)
        self.workers_per_artifact = 4  # four workers for the one slot: three always wait

    monkeypatch.setattr(RunGroup, "__init__", four_workers)
    hub, _ = store_alone(settings, three, tmp_path, connections=1)
    names = [p.name for p in three.parts["store"]]
    served = [(names.index(path), int(rng.split("=")[1].split("-")[0])) for path, rng in hub.stats.ranges
              if path in names]
    assert len(served) >= 3 * len(names), "several segments per part"
    assert served == sorted(served), "every range in (part, offset) order"


class _Part:
    def __init__(self, idx: int) -> None:
        self.idx = idx


def test_the_segment_queue_hands_out_the_lowest_part_and_offset_first():
    """Queued out of order (a part failing sha256 is queued again behind later ones): handed out lowest
    (part, offset) first, each range once, whole."""
    seg = 1 << 20
    q, parts = SegmentQueue(), [_Part(0), _Part(1)]
    for part in reversed(parts):
        for start in (seg, 0):
            q.put(part, start, start + seg)  # type: ignore[arg-type]
    assert q.first_part() == 0
    popped = []
    while (got := q.pop()) is not None:
        popped.append((got[0].idx, got[1], got[2]))
    assert popped == [(0, 0, seg), (0, seg, 2 * seg), (1, 0, seg), (1, seg, 2 * seg)]
    assert q.first_part() is None and not q.wait(0.01)


def test_each_range_is_a_whole_segment_and_the_tree_matches(settings, three, tmp_path):
    """With four connections every range asked of the hub is one whole segment (or a part's last one), each
    part verifies once its segments are in, and the tree is the reference's."""
    hub, seg = store_alone(settings, three, tmp_path, connections=4)
    assert trees_of(tmp_path / "dest", ["store"]) == {"store": three.reference["store"]}
    sizes = {p.name: p.stat().st_size for p in three.parts["store"]}
    ranges = [(path, a, b + 1) for path, rng in hub.stats.ranges if path in sizes
              for a, b in [map(int, rng.split("=")[1].split("-"))]]
    assert ranges and all(a % seg == 0 and (b - a == seg or b == sizes[path]) for path, a, b in ranges), ranges
