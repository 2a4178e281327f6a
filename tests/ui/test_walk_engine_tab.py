"""Issue 49, the Engine tab during a switch: the selector shows the switch's target (not the profile being
stopped), Start and Switch wait for the operation, the state is said once ("stopping", not "stopping ·
stopping"), a Stop's drain button says "Stop now", and the per-GPU table is redrawn with the header."""

from __future__ import annotations

import inspect
from pathlib import Path

from app.backend.config.settings import resolve_settings
from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.engine.lifecycle.tickets import Ticket
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.state import AppState
from app.ui import engine as tab
from app.ui.header import header_html

STOPPING_OLD = EngineSnapshot(state=EngineState.STOPPING, profile_id="quality", phase="stopping")


def test_during_a_switch_the_selector_shows_its_target_and_the_buttons_wait() -> None:
    switching = Ticket(id=7, action="switch", profile_id="balanced", accepted=True)
    assert tab.shown_profile(STOPPING_OLD, switching) == "balanced"  # not the profile being stopped
    assert tab.controls(STOPPING_OLD, "balanced", switching) == (False, False)  # Start was clickable here
    assert tab.controls(STOPPING_OLD, "balanced", None)[0] is True  # what it was without the operation
    ready = EngineSnapshot(state=EngineState.READY, profile_id="balanced")
    assert tab.shown_profile(ready, None) == "balanced" and tab.controls(ready, "balanced", None) == (False, False)
    # the operation's end moves the key: the selector and buttons are redrawn once it is over
    assert tab.view_key(ready, switching) != tab.view_key(ready, None)
    stopped = EngineSnapshot(state=EngineState.STOPPED)
    assert tab.shown_profile(stopped, None) is None and tab.controls(stopped, "quality", None) == (True, False)


def test_the_state_is_said_once(tmp_path: Path) -> None:
    state = AppState(settings=resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True))
    head = header_html(state, STOPPING_OLD, None)
    assert "stopping · stopping" not in head and "stopping" in head
    badge = tab.status_html(STOPPING_OLD, "local process", "")
    assert "stopping · stopping" not in badge.lower()
    booting = EngineSnapshot(state=EngineState.STARTING, profile_id="quality", phase="planes from cache 12/43")
    assert "starting · planes from cache 12/43" in header_html(state, booting, None)


def test_the_drain_button_names_what_waits_and_the_gpu_table_follows_the_header() -> None:
    src = inspect.getsource(tab.render)
    assert '"Stop now" if busy is not None and busy.action == "stop" else "Switch now"' in src
    # the per-GPU table is a redraw of the feed's tick (the header's), not a timer of its own
    assert "shell.on_tick(_gpu_rows" in src and "shell.timer.tick(_gpu_rows" not in src


def test_the_selector_moves_only_when_what_serves_moved() -> None:
    # an operation's end (start:quality -> ready quality) seen after the user picked balanced: the pick stays
    assert tab.selector_after("quality", "quality", "balanced") == (False, "balanced")
    # what serves moved (a switch to balanced made elsewhere): the selector follows it
    assert tab.selector_after("quality", "balanced", "quality") == (True, "balanced")
    # a fresh page (nothing drawn yet): the selector shows what serves
    assert tab.selector_after(None, "quality", "balanced") == (True, "quality")
