"""Helpers shared by the chat tests (imported as `chat_helpers`; pytest puts this folder on sys.path)."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState
from app.backend.simengine import SimEngineConfig, SimEngineServer

FAST_TOK_S = 2000.0


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


@contextlib.contextmanager
def chat_panel(data_dir: Path, auth: object = None, **sim_overrides: object) -> Iterator[tuple[str, FakeEngine, Any]]:
    """The Chat tab alone on a SIMULATED engine, launched as `moet-panel serve` launches it (the HTTP
    gate, auth): yields (url, engine, tests.conftest.Panel)."""
    import app.ui.app as ui_app
    from app.backend.chat.conversations import ChatService
    from app.backend.config.settings import resolve_settings
    from app.backend.state import AppState
    from tests.conftest import close_panel, launch_state

    sim = start_sim(**sim_overrides)
    settings = resolve_settings(demo=True, data_dir=data_dir)
    state = AppState(settings=settings)
    engine = FakeEngine(sim, profile_id="quality")
    state.chat = ChatService(settings.recipe, settings.ensure_state_dir(), snapshot_fn=engine.snapshot)
    old = ui_app.TABS[:]
    ui_app.TABS[:] = ["app.ui.chat"]
    try:
        p = launch_state(state, auth=auth)
    except BaseException:
        sim.stop()
        raise
    finally:
        ui_app.TABS[:] = old
    try:
        yield p.url, engine, p
    finally:
        close_panel(p)
        sim.stop()
