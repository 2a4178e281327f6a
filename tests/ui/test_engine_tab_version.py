"""Issue 49: the Engine tab's version on the page feed is what the tab shows of the engine, not the change event's
seq: the canary's result (every 30 s, shown on the Service tab only) sent the idle Engine tab a Gradio event."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.backend.config.settings import resolve_settings
from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.recipe.loader import SIMULATED_RECIPE
from app.backend.state import build_app_state


class HeldWatch:
    """The page's engine watch, its (seq, snapshot) set by the test."""

    def __init__(self, snap: EngineSnapshot) -> None:
        self.now = (1, snap)

    def current(self) -> tuple[int, EngineSnapshot]:
        return self.now

    def move(self, **changes: Any) -> None:
        self.now = (self.now[0] + 1, dataclasses.replace(self.now[1], **changes))

    def close(self) -> None:
        pass


@pytest.fixture
def engine_version() -> Iterator[tuple[Any, HeldWatch]]:
    from app.ui.app import SHELL_ATTR, build_ui

    home = Path(tempfile.mkdtemp(prefix="moet-engine-version-", dir=Path.home()))
    settings = resolve_settings(SIMULATED_RECIPE, home / "data", demo=True)
    settings.ensure_state_dir()
    state = build_app_state(settings)
    try:
        shell = getattr(build_ui(state), SHELL_ATTR)
        watch = HeldWatch(EngineSnapshot(state=EngineState.READY, profile_id="quality", container_id="c1",
                                         simulated=True))
        shell.engine = watch
        yield shell.versions["engine"], watch
    finally:
        state.close()
        shutil.rmtree(home, ignore_errors=True)


def test_a_canary_result_does_not_move_the_engine_tabs_version(engine_version) -> None:
    version, watch = engine_version
    before = version()
    watch.move(canary="ok (0.02 s)", canary_ok=True, canary_at=1.0, canary_latency_s=0.02)
    assert version() == before  # nothing the Engine tab shows moved: no redraw, no Gradio event
    watch.move(message="serving")  # a line of the status box
    assert version() != before
    shown = version()
    watch.move(state=EngineState.STOPPED)  # the badge, the selector and the buttons
    assert version() != shown
