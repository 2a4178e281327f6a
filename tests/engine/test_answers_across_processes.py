"""A stop or switch from another process (a CLI `engine switch`) drains the panel's answers too (issue 39 item 2;
the chaos soak's switch fault runs the CLI while the panel's gateway streams): the panel publishes its count, every
controller counts what another live process published, never its own and never a dead one's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.backend.engine.lifecycle.answers import FILE, AnswersPublisher, OtherProcessAnswers, Published
from app.backend.files.jsonstore import JsonStore
from tests.polling import wait_for


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def answers_in_flight(self) -> int:
        return self.n


def test_another_live_process_count_is_seen_and_its_own_or_a_dead_ones_is_not(tmp_path: Path) -> None:
    store = JsonStore(tmp_path / FILE, Published)
    other = OtherProcessAnswers(tmp_path)
    assert other.answers_in_flight() == 0  # nothing published
    store.write(Published(os.getppid(), 2, 0.0))  # a live process (this test's parent) streams 2
    assert other.answers_in_flight() == 2
    store.write(Published(os.getpid(), 3, 0.0))  # this process's own answers: its own counters count them
    assert other.answers_in_flight() == 0
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store.write(Published(dead.pid, 4, 0.0))  # the publisher died mid-answer: nothing to wait for
    assert other.answers_in_flight() == 0


def test_the_publisher_writes_on_change_and_zero_when_closed(tmp_path: Path) -> None:
    a, b = Counter(), Counter()
    pub = AnswersPublisher(tmp_path, [a, b])
    store = JsonStore(tmp_path / FILE, Published)
    pub.start()
    try:
        a.n, b.n = 1, 2
        wait_for(lambda: (p := store.read()) is not None and p.count == 3, 10, "the sum published")
        assert store.read().pid == os.getpid()  # type: ignore[union-attr]
    finally:
        pub.close()
    assert store.read().count == 0  # type: ignore[union-attr]


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
