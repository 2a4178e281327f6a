"""The Engine tab's busy line names who is changing the engine (docs/engine.md: one writer across processes)."""

from __future__ import annotations

from app.backend.engine.lifecycle.oplock import Holder
from app.backend.engine.lifecycle.tickets import Ticket
from app.ui.engine import busy_line

HOLDER = Holder(pid=4242, actor="CLI", operation="start", since=0.0, profile="speed")


def ticket(action: str, profile: str | None = "speed") -> Ticket:
    return Ticket(id=1, action=action, profile_id=profile, accepted=True)


def test_own_operation_is_named_with_its_profile() -> None:
    assert busy_line(ticket("switch", "balanced"), None) == "switch balanced in progress…"


def test_watching_another_writers_boot_names_the_lock_holder_not_adopt() -> None:
    line = busy_line(ticket("adopt"), HOLDER)
    assert line.startswith("the engine is being changed by CLI pid 4242 (start to speed")
    assert "adopt" not in line


def test_watching_a_boot_started_without_the_lock_says_outside() -> None:
    assert busy_line(ticket("adopt"), None) == "following a start of speed made outside this panel…"


def test_idle_panel_names_the_holder_or_says_nothing() -> None:
    assert busy_line(None, HOLDER).startswith("the engine is being changed by CLI pid 4242")
    assert busy_line(None, None) == ""


def test_own_mutating_operation_wins_over_its_own_lock() -> None:
    # this panel holds the lock for its own switch: the line names the operation, not "changed by"
    assert busy_line(ticket("switch", "balanced"), HOLDER) == "switch balanced in progress…"
