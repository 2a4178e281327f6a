"""The panel's counters: switch results as the controller words its tickets, the restarts it makes itself,
the gate's refusal statuses by reason."""

from __future__ import annotations

from app.backend.engine.ops import Ticket
from app.backend.monitoring.counters import PanelCounters


def _done(action: str, ok: bool, message: str) -> Ticket:
    return Ticket(1, action, "balanced", True, message, ok=ok)


def test_switch_results_and_restarts() -> None:
    c = PanelCounters()
    c.engine_op(_done("switch", True, "balanced ready"))
    c.engine_op(_done("switch", True, "already serving balanced"))
    c.engine_op(_done("switch", False, "switch to speed failed: CUDA OOM at load; rolled back to balanced"))
    c.engine_op(_done("switch", False, "switch to speed failed: CUDA OOM at load; rollback to balanced failed too"))
    c.engine_op(_done("switch", False, "switch to speed cancelled by stop"))
    c.engine_op(_done("restart", True, "balanced ready"))
    c.engine_op(_done("start", True, "balanced ready"))  # neither a switch nor a restart
    c.engine_op(_done("stop", True, "engine stopped"))
    assert c.switches() == {"ok": 2, "rolled_back": 1, "failed": 1, "cancelled": 1}
    assert c.restarts == 1


def test_refusals_by_reason() -> None:
    c = PanelCounters()
    for status in (421, 421, 403, 400, 404, 405, 401, 413, 418):
        c.refused(status)
    assert c.refusals() == {"host": 2, "origin": 1, "forwarding_header": 1, "unused_route": 1, "method": 1,
                            "no_session": 1, "body_too_large": 1, "other": 1}
