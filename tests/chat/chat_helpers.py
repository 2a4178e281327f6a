"""Helpers shared by the chat tests (imported as `chat_helpers`; pytest puts this folder on sys.path)."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from app.backend.engine.types import Diagnosis, EngineSnapshot, EngineState
from app.backend.simengine import SimEngineConfig, SimEngineServer

FAST_TOK_S = 2000.0


def wait_for(pred: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> object:
    """Poll with a deadline (never a bare sleep as synchronisation)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def start_sim(**overrides: object) -> SimEngineServer:
    settings: dict[str, object] = {"port": 0, "boot_s": 0.0, "decode_tok_s": FAST_TOK_S, **overrides}
    cfg = SimEngineConfig(**settings)  # type: ignore[arg-type]
    sim = SimEngineServer(cfg, log=io.StringIO()).start()
    assert sim.wait_ready(10), "simulated engine did not become ready"
    return sim


@dataclass
class FakeEngine:
    """Stands in for the engine controller: snapshot() describes the sim; dies when the sim dies."""

    sim: SimEngineServer
    profile_id: str = "balanced"
    state: EngineState = EngineState.READY
    diagnosis: Diagnosis | None = None

    def snapshot(self) -> EngineSnapshot:
        snap = EngineSnapshot(state=self.state, profile_id=self.profile_id, base_url=self.sim.base_url,
                              served_name=self.sim.config.served_name, simulated=True, diagnosis=self.diagnosis)
        if self.sim.state == "dead":
            snap = replace(snap, state=EngineState.FAILED, diagnosis=CRASH_DIAGNOSIS)
        return snap


CRASH_DIAGNOSIS = Diagnosis(
    reason="engine_dead", title="Engine core crashed mid-generation",
    explanation="EngineCore encountered a fatal error.", fix="Restart the engine from the Engine tab.",
)
