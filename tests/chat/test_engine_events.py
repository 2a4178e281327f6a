"""The chat follows the engine's change events (docs/engine.md, "Who listens"): whether it can talk to the
engine, and why not, come from the snapshot the events keep — never a read of the controller per call — and
its one subscription ends with the service."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

from app.backend.chat.events import StreamError
from app.backend.chat.conversations import ChatService
from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState
from app.backend.engine.decider.events import EventBus
from app.backend.recipe import SIMULATED_RECIPE, load_recipe

DIED = Diagnosis(reason="engine_dead", title="Engine core crashed mid-generation",
                 explanation="EngineCore encountered a fatal error.", fix="Restart the engine from the Engine tab.")


class PublishingEngine:
    """The controller's event side: `watch()` and changes published as its reconciler does. `snapshot()` is
    there to fail: the chat must not read the controller itself."""

    def __init__(self, snap: EngineSnapshot) -> None:
        self.events = EventBus()
        self.snap = snap

    def watch(self, on_change=None):
        return self.events.watch(self.snap, on_change)

    def snapshot(self) -> EngineSnapshot:
        raise AssertionError("the chat read the controller instead of its events")

    def change(self, **kw: object) -> None:
        before, self.snap = self.snap, dataclasses.replace(self.snap, **kw)  # type: ignore[arg-type]
        self.events.publish("Test", before, self.snap)


def _service(tmp_path: Path, engine: PublishingEngine) -> ChatService:
    return ChatService(load_recipe(SIMULATED_RECIPE), tmp_path / "state", engine=engine)


def test_availability_follows_the_engine_events(tmp_path: Path) -> None:
    eng = PublishingEngine(EngineSnapshot(state=EngineState.STOPPED))
    chat = _service(tmp_path, eng)
    try:
        ep = chat.endpoint()
        assert not ep.ready and ep.reason.startswith("The engine is stopped"), ep.reason
        seq0 = chat.engine_seq
        for _ in range(100):  # a page asking every second: no subscription per call
            chat.endpoint()
        assert eng.events.subscribers == 1
        eng.change(state=EngineState.READY, profile_id="balanced", base_url="http://127.0.0.1:9", served_name="m")
        ep = chat.endpoint()  # at once: the watch is set by the publisher, no thread in between
        assert ep.ready and ep.profile_id == "balanced" and ep.model == "m" and chat.engine_seq > seq0
        eng.change(state=EngineState.FAILED, diagnosis=DIED, message="engine exited (code 1)")
        ep = chat.endpoint()
        assert not ep.ready and DIED.title in ep.reason and ep.diagnosis == DIED
    finally:
        chat.close()
    assert eng.events.subscribers == 0  # unsubscribed on close


def test_a_broken_reply_waits_for_the_diagnosis_event(tmp_path: Path) -> None:
    """The reply's error text carries the diagnosis the controller publishes a moment after the stream broke:
    the service wakes on that event (no fixed 0.1 s look-again)."""
    eng = PublishingEngine(EngineSnapshot(state=EngineState.READY, base_url="http://127.0.0.1:9", profile_id="quality"))
    chat = _service(tmp_path, eng)
    try:
        ep = chat.endpoint()
        timer = threading.Timer(0.3, lambda: eng.change(state=EngineState.FAILED, diagnosis=DIED))
        timer.start()
        t0 = time.monotonic()
        text = chat._diagnose(StreamError("broken", "the stream broke", 0.0), ep)
        took = time.monotonic() - t0
        timer.join()
        assert f"Diagnosis: {DIED.title}" in text, text
        assert took < 1.5, took  # woken by the event, not the 2 s deadline
    finally:
        chat.close()
