"""The controller's change events: every applied step is published; a slow or stuck subscriber never blocks
the writer (docs/engine.md, "One writer, events out")."""

from __future__ import annotations

import threading

from app.backend.engine.decider import statemachine as sm
from app.backend.engine.decider.events import EventBus
from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState
from tests.polling import wait_for


def test_failed_event_keeps_the_failed_runs_container_without_a_bypass() -> None:
    snap = sm.transition(EngineSnapshot(), sm.BootBegan("quality", "c1", "ds4", "http://x", "m", True))
    d = Diagnosis("killed", "killed", "", "")
    out = sm.transition(sm.transition(snap, sm.Vanished("gone")), sm.Failed(d, "exited", container_id="c1",
                                                                             container_name="ds4"))
    assert out.state is EngineState.FAILED and out.container_id == "c1" and out.container_name == "ds4"


def test_stuck_subscriber_never_blocks_the_publisher_and_loses_only_its_oldest() -> None:
    bus = EventBus()
    stuck = bus.subscribe(maxsize=4)  # never read
    seen: list[int] = []
    gate = threading.Event()

    def slow(ev) -> None:  # blocks its own pump thread only
        gate.wait(5)
        seen.append(ev.seq)

    unsubscribe = bus.subscribe_callback(slow, maxsize=1000)
    a = EngineSnapshot()
    writer = threading.Thread(target=lambda: [bus.publish("Noted", a, a) for _ in range(200)])
    writer.start()
    writer.join(10)  # a deadline, not a timing: with the callback still blocked, a blocking publish never ends
    assert not writer.is_alive()
    assert [e.seq for e in stuck.drain()] == [197, 198, 199, 200] and stuck.dropped == 196
    gate.set()
    wait_for(lambda: len(seen) == 200, 10, "the slow subscriber to get every event")
    assert seen == list(range(1, 201))
    unsubscribe()
    assert bus.subscribers == 1
    stuck.close()
    assert bus.subscribers == 0


def test_watch_keeps_the_newest_snapshot_and_wakes_a_waiter() -> None:
    """A SnapshotWatch (docs/engine.md, "Who listens"): set by the publisher itself, so a reader never lags
    the writer; `wait` wakes on the next change; a closed watch is left alone."""
    bus = EventBus()
    a, b, c = EngineSnapshot(), EngineSnapshot(state=EngineState.STARTING), EngineSnapshot(state=EngineState.READY)
    flags: list[int] = []
    w = bus.watch(a, on_change=lambda: flags.append(1))
    assert w.current() == (0, a) and bus.subscribers == 1
    bus.publish("BootBegan", a, b)
    assert w.current() == (1, b) and flags == [1]  # in line: no thread, no queue between
    assert w.wait(1, 0.01) == (1, b)  # nothing new: back after the timeout
    threading.Timer(0.1, lambda: bus.publish("BecameReady", b, c)).start()
    assert w.wait(1, 10) == (2, c)  # woken by the change (a deadline, not a timing)
    w.close()
    bus.publish("Stopped", c, a)
    assert w.current() == (2, c) and bus.subscribers == 0 and w.wait(2, 10) == (2, c)  # closed: returns at once


def test_only_the_reconciler_thread_writes_engine_state(make_controller, docker_client, monkeypatch) -> None:
    """Start, a second panel adopting, an outside kill, a start and a stop: every transition of either panel
    ran on a thread named engine-reconciler (docs/engine.md, "One writer, events out")."""
    from app.backend.engine.controller import EngineController

    writers: set[str] = set()
    real = sm.transition

    def spy(snap: EngineSnapshot, event: sm.Event, now: float | None = None) -> EngineSnapshot:
        writers.add(threading.current_thread().name)
        return real(snap, event, now)

    monkeypatch.setattr(sm, "transition", spy)
    a: EngineController = make_controller()
    b: EngineController = make_controller()
    assert a.start("balanced").wait(60) and a.snapshot().state is EngineState.READY
    wait_for(lambda: b.snapshot().state is EngineState.READY, 10, "B adopts A's engine")
    docker_client.containers.get(a.snapshot().container_id).kill()
    wait_for(lambda: a.snapshot().state is EngineState.FAILED and b.snapshot().state is EngineState.FAILED, 10,
               "both panels see the kill")
    assert b.start("speed").wait(60) and b.snapshot().state is EngineState.READY
    stop = a.stop()
    assert stop.wait(60) and stop.ok, stop.message
    assert a.snapshot().state is EngineState.STOPPED
    assert writers == {"engine-reconciler"}, writers
