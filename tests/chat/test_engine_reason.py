"""The chat's 'why can't I chat' line says each fact once (issue 29: "The engine is stopped (engine stopped
outside the panel (exit code 0)). stopped outside the panel.")."""

from __future__ import annotations

from app.backend.chat.endpoint import engine_reason
from app.backend.engine.logs.diagnosis import classify
from app.backend.engine.logs.exits import STOPPED_OUTSIDE
from app.backend.contracts import EngineSnapshot, EngineState


def test_stopped_outside_the_panel_is_said_once() -> None:
    # The controller's message for a clean exit is f"engine {d.title} (exit code N)" beside the diagnosis d.
    snap = EngineSnapshot(state=EngineState.STOPPED, diagnosis=STOPPED_OUTSIDE,
                          message=f"engine {STOPPED_OUTSIDE.title} (exit code 0)")
    text = engine_reason(snap)
    assert text.lower().count("stopped outside the panel") == 1, text
    assert "exit code 0" in text and "((" not in text and "))" not in text, text
    assert text.startswith("The engine is stopped"), text
    assert text.endswith("Start or fix it on the Engine tab."), text


def test_a_diagnosis_not_in_the_message_is_still_shown() -> None:
    d = classify(1, False, ["torch.OutOfMemoryError: CUDA out of memory"])
    snap = EngineSnapshot(state=EngineState.FAILED, diagnosis=d, message="engine exited (code 1)")
    text = engine_reason(snap)
    assert "engine exited (code 1)" in text and d.title in text, text


def test_engine_status_says_the_stop_reason_once(capsys) -> None:
    """`moet-panel engine status` after a clean outside stop: the note and the diagnosis were the same words."""
    from app.cli.engine import _status

    snap = EngineSnapshot(state=EngineState.STOPPED, diagnosis=STOPPED_OUTSIDE,
                          message=f"engine {STOPPED_OUTSIDE.title} (exit code 0)")

    class _Ctl:  # what `_status` reads of the controller, for a stopped engine with no container
        runtime = None
        runtime_error = "no runtime in this test"
        settings = None

        def snapshot(self) -> EngineSnapshot:
            return snap

        def lock_holder(self) -> None:
            return None

        def desired(self) -> None:
            return None

        def recent_logs(self, n: int) -> list:
            return []

    import argparse

    _status(argparse.Namespace(json=False), _Ctl())  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert out.lower().count("stopped outside the panel") == 1, out
    assert "diagnosis: engine stopped outside the panel (exit code 0)" in out and "fix:" in out, out
