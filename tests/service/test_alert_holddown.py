"""Alerts with hold-down (issue 39 item 5): an alert starts after its condition held for a set time and
resolves after it stayed clear for a set time; no flapping at the card's own 97.7 % VRAM beside the 98 % line;
"resolved" only for what was announced; Apprise types by severity. Fake clock and sample sequences, no sleeps."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState, GpuSample
from app.backend.alerts.delivery import AlertService, AlertTracker, Condition, Message, condition_hold_down
from app.backend.alerts import rules as alert_rules
from app.backend.alerts.rules import Alert, AlertInputs
from app.backend.contracts import GiB

TOTAL = 96 * GiB


def gpu(fraction: float) -> GpuSample:
    return GpuSample(0, "GPU-0", "RTX PRO 6000", (12, 0), TOTAL, int(TOTAL * fraction), 0)


class FakeTelemetry:
    """The hub's `alerts`, from the real rules over one GPU sample."""

    def __init__(self) -> None:
        self.fraction = 0.5

    @property
    def alerts(self) -> tuple[Alert, ...]:
        return tuple(alert_rules.evaluate(AlertInputs(gpus=[gpu(self.fraction)])))


@dataclass
class FakeNotifier:
    sent: list[tuple[str, str, str]] = field(default_factory=list)

    def send(self, title: str, body: str, kind: str = "info") -> bool:
        self.sent.append((title, body, kind))
        return True


@dataclass
class Clock:
    t: float = 1000.0

    def __call__(self) -> float:
        return self.t


def service(clock: Clock, telemetry: FakeTelemetry, notifier: FakeNotifier) -> AlertService:
    svc = AlertService(notifier, telemetry=telemetry, period_s=3600.0, clock=clock)  # type: ignore[arg-type]
    svc.close()  # the thread is not needed: evaluate() is driven by the test
    return svc


def run(svc: AlertService, clock: Clock, telemetry: FakeTelemetry, fractions: list[float], step_s: float = 1.0) -> None:
    for f in fractions:
        telemetry.fraction = f
        svc.evaluate()
        clock.t += step_s


def test_vram_oscillating_at_the_cards_own_977_percent_never_flaps() -> None:
    clock, tel, notes = Clock(), FakeTelemetry(), FakeNotifier()
    svc = service(clock, tel, notes)
    run(svc, clock, tel, [0.977, 0.982] * 1800)  # an hour of samples crossing the 98 % line every second
    assert notes.sent == []


def test_sustained_vram_is_told_once_and_resolved_once_after_it_stayed_clear() -> None:
    clock, tel, notes = Clock(), FakeTelemetry(), FakeNotifier()
    svc = service(clock, tel, notes)
    hold = alert_rules.hold_down("vram_full")
    run(svc, clock, tel, [0.985] * int(hold.start_s))
    assert notes.sent == []  # not yet held long enough
    run(svc, clock, tel, [0.985] * 5)
    assert [(t, k) for t, _, k in notes.sent] == [("GPU 0 VRAM above 98%", "warning")]
    run(svc, clock, tel, [0.977, 0.982] * 600)  # back at the line: neither repeated nor resolved
    assert len(notes.sent) == 1
    run(svc, clock, tel, [0.977] * int(hold.clear_s + 5))
    assert [(t, k) for t, _, k in notes.sent[1:]] == [("GPU 0 VRAM above 98% — resolved", "success")]
    run(svc, clock, tel, [0.977] * 600)
    assert len(notes.sent) == 2


def test_a_condition_that_clears_before_it_was_told_is_never_resolved() -> None:
    """The old tracker sent 'FP4 pool empty while serving — resolved' for an alert nobody was told of."""
    clock = Clock()
    t = AlertTracker()
    blip = Condition("telemetry:zero_coverage", 2, "FP4 pool empty while serving", "", "failure")
    assert t.update([blip], lambda c: f"{c.title} — resolved", clock()) == []
    clock.t += 10.0
    assert t.update([], lambda c: f"{c.title} — resolved", clock()) == []
    clock.t += 3600.0
    assert t.update([], lambda c: f"{c.title} — resolved", clock()) == []
    assert t.active == {}


def test_notify_types_follow_severity() -> None:
    clock = Clock()
    t = AlertTracker()
    d = Diagnosis("killed", "killed (SIGKILL, exit 137)", "why", "fix")
    crash = EngineSnapshot(state=EngineState.FAILED, diagnosis=d, desired="serve:quality", restart_try=1,
                           message="killed (SIGKILL, exit 137) — restarting, try 1 of 3")
    from app.backend.alerts.delivery import engine_conditions

    out = t.update(engine_conditions(crash), lambda c: "engine ready again — resolved", clock())
    assert [m.kind for m in out] == ["failure"]  # a crash is told at once (hold-down 0), as a failure
    ready = EngineSnapshot(state=EngineState.READY, profile_id="quality", desired="serve:quality")
    out = t.update(engine_conditions(ready), lambda c: "engine ready again — resolved", clock())
    assert out == [Message("engine ready again — resolved", "", "success", resolved=True)]
    assert condition_hold_down("engine").start_s == 0.0
    assert condition_hold_down("telemetry:vram_full") == alert_rules.hold_down("vram_full")


def test_every_alert_id_has_a_documented_hold_down() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "telemetry.md").read_text()
    for alert_id, hold in alert_rules.HOLD_DOWN.items():
        assert f"| `{alert_id}` | {hold.start_s:g} s | {hold.clear_s:g} s |" in doc, alert_id
