"""A stop or switch from another process (a CLI `engine switch`) drains the panel's answers too (issue 39 item 2;
the chaos soak's switch fault runs the CLI while the panel's gateway streams): the panel publishes its count, every
controller counts what another live process published, never its own and never a dead one's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.backend.engine.lifecycle.answers import AnswersPublisher, OtherProcessAnswers, Published, file_of
from app.backend.files.jsonstore import JsonStore
from tests.polling import wait_for


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def answers_in_flight(self) -> int:
        return self.n


def test_another_live_process_count_is_seen_and_its_own_or_a_dead_ones_is_not(tmp_path: Path) -> None:
    parent = JsonStore(tmp_path / file_of(os.getppid()), Published)
    other = OtherProcessAnswers(tmp_path)
    assert other.answers_in_flight() == 0  # nothing published
    parent.write(Published(os.getppid(), 2, 0.0))  # a live process (this test's parent) streams 2
    assert other.answers_in_flight() == 2
    JsonStore(tmp_path / file_of(os.getpid()), Published).write(Published(os.getpid(), 3, 0.0))
    assert other.answers_in_flight() == 2  # this process's own answers: its own counters count them
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    JsonStore(tmp_path / file_of(dead.pid), Published).write(Published(dead.pid, 4, 0.0))
    assert other.answers_in_flight() == 2  # the publisher died mid-answer: nothing to wait for


def test_two_publishers_add_up_and_a_gpus_drain_counts_that_gpus_answers(tmp_path: Path) -> None:
    """A panel and a standalone gateway on one data dir never overwrite each other's count; on a box of several
    GPUs each GPU's drain (a rolling switch) waits for the answers on that GPU only."""
    grandparent = os.getppid()  # two live processes other than this one: the parent and pid 1
    JsonStore(tmp_path / file_of(grandparent), Published).write(Published(grandparent, 3, 0.0, {"0": 1, "1": 2}))
    JsonStore(tmp_path / file_of(1), Published).write(Published(1, 1, 0.0))  # not per GPU: counts for each GPU
    assert OtherProcessAnswers(tmp_path).answers_in_flight() == 4
    assert OtherProcessAnswers(tmp_path, gpu=0).answers_in_flight() == 2
    assert OtherProcessAnswers(tmp_path, gpu=1).answers_in_flight() == 3
    assert OtherProcessAnswers(tmp_path, gpu=2).answers_in_flight() == 1


def test_the_publisher_writes_on_change_and_zero_when_closed(tmp_path: Path) -> None:
    a, b = Counter(), Counter()
    pub = AnswersPublisher(tmp_path, [a, b], lambda: {0: a.n, 1: b.n})
    store = JsonStore(tmp_path / file_of(os.getpid()), Published)
    pub.start()
    try:
        a.n, b.n = 1, 2
        pub.poke()
        wait_for(lambda: (p := store.read()) is not None and p.count == 3, 10, "the sum published")
        assert store.read().pid == os.getpid() and store.read().by_gpu == {"0": 1, "1": 2}  # type: ignore[union-attr]
    finally:
        pub.close()
    assert not store.path.exists()  # closed: its file goes


def test_a_drain_note_is_seen_from_another_live_process_only(tmp_path: Path) -> None:
    import time

    from app.backend.engine.lifecycle.drainnote import FILE as NOTE, DrainNote, DrainNotes

    store = JsonStore(tmp_path / NOTE, DrainNote)
    notes = DrainNotes(tmp_path)
    assert notes.other() is None  # no note
    store.write(DrainNote(os.getppid(), True, 2, time.time() + 60, 12.0))  # a CLI switch drains 2 answers
    seen = notes.other()
    assert seen is not None and (seen.in_flight, seen.expected_back_s) == (2, 12.0)
    store.write(DrainNote(os.getppid(), False))  # its drain ended
    assert notes.other() is None
    store.write(DrainNote(os.getppid(), True, 1, time.time() - 60))  # long past its deadline: stale
    assert notes.other() is None
    notes.publish(True, 1, time.time() + 60)  # this process's own drain is its own
    assert notes.other() is None
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.write(DrainNote(dead.pid, True, 1, time.time() + 60))  # the CLI was killed mid-drain
    assert notes.other() is None
