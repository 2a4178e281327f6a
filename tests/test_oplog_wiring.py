"""The operator's log is wired (issue 39 item 4): decisions with who asked — failed and refused logins, a
setting changed from the page, an alert sent and resolved — and a repeating error in a loop logged once."""

from __future__ import annotations

import io
from pathlib import Path
from types import SimpleNamespace


from tests.aio import run_async
from tests.polling import wait_for
from app.backend import oplog


def test_failed_and_refused_logins_name_the_user_and_address(oplog_lines: io.StringIO) -> None:
    from app.backend.web.auth import LoginGuard, LoginNote, LoginThrottle, hash_password, make_checker

    throttle = LoginThrottle(free_account=0, free_client=0, interval_s=100, horizon_s=0.0, clock=lambda: 50.0)
    notes: list[LoginNote] = []

    def note() -> LoginNote:
        notes.append(LoginNote(address="192.0.2.7"))
        return notes[-1]

    check = make_checker({"alice": hash_password("right")}, LoginGuard(throttle=throttle), note_of=note)
    assert run_async(lambda: check("alice", "wrong")) is False
    assert run_async(lambda: check("alice", "again")) is False  # paced beyond the horizon: refused unchecked
    lines = oplog_lines.getvalue().splitlines()
    assert any("action=login_failed who=user:alice" in ln and "address=192.0.2.7" in ln for ln in lines), lines
    assert any("action=login_refused who=user:alice" in ln and "reason=\"paced" in ln for ln in lines), lines
    assert "wrong" not in oplog_lines.getvalue() and "again" not in oplog_lines.getvalue()  # never the password


def test_a_setting_changed_from_the_page_names_who_changed_it(oplog_lines: io.StringIO, tmp_path: Path) -> None:
    from app.backend.service import panel

    state = SimpleNamespace(settings=SimpleNamespace(state_dir=tmp_path))
    assert panel.set_policy(state, "never", who=oplog.user("bob")).startswith("restart policy saved")  # type: ignore[arg-type]
    assert "action=setting_changed who=user:bob setting=restart_policy old=recipe new=never" in oplog_lines.getvalue()
    panel.clear_notify_urls(state, who=oplog.user("bob"))  # type: ignore[arg-type]
    assert 'setting=notify_urls new=(none)' in oplog_lines.getvalue()


class _Notes:
    def send(self, title: str, body: str, kind: str = "info") -> bool:
        return True


def test_alerts_sent_and_resolved_are_decisions(oplog_lines: io.StringIO) -> None:
    from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState
    from app.backend.alerts.delivery import AlertService

    snap = [EngineSnapshot(state=EngineState.FAILED, diagnosis=Diagnosis("killed", "killed", "why", "fix"),
                           desired="serve:quality", restart_try=1, message="killed — restarting, try 1 of 3")]
    engine = SimpleNamespace(snapshot=lambda: snap[0], subscribe=lambda: None)
    svc = AlertService(_Notes(), period_s=3600, clock=lambda: 0.0)  # type: ignore[arg-type]
    svc.close()
    svc._engine = engine  # type: ignore[assignment]
    svc.evaluate()
    snap[0] = EngineSnapshot(state=EngineState.READY, profile_id="quality", desired="serve:quality")
    svc.evaluate()
    text = oplog_lines.getvalue()
    assert "action=alert_sent who=panel" in text and "type=failure" in text
    assert "action=alert_resolved who=panel" in text and "type=success" in text


def test_a_failing_alert_source_is_logged_once_not_once_per_pass(oplog_lines: io.StringIO) -> None:
    from app.backend.alerts.delivery import AlertService

    calls = [0]

    class Broken:
        @property
        def alerts(self) -> tuple[()]:
            calls[0] += 1
            raise RuntimeError("hub state torn")

    before = oplog.error_counts().get("service", 0)
    svc = AlertService(_Notes(), telemetry=Broken(), period_s=0.001)  # type: ignore[arg-type]
    try:
        wait_for(lambda: calls[0] >= 20, 30, "20 passes of the alert loop")
    finally:
        svc.close()
    assert oplog_lines.getvalue().count("hub state torn") == 1
    assert oplog.error_counts()["service"] == before + 1
