"""Which alerts a person is told about, and when (docs/engine.md, "Telling a person").

Conditions are computed from what the panel already shows — the engine snapshot (its message is the
panel's own wording: "killed (SIGKILL, exit 137) — restarting, try 1 of 3"), the telemetry alerts, the
downloads, the data dir's free space — and `AlertTracker` turns them into messages: ONE when a condition
starts, one more only when it escalates (the supervisor gave up), ONE when it ends ("engine ready again on
quality — resolved"), nothing while it lasts. `AlertService` runs this on a thread of its own, woken by the
engine's change events (never polling the engine) and every few seconds for the rest.
"""

from __future__ import annotations

import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, NamedTuple

from app.backend import oplog
from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.alerts import rules as alert_rules
from app.backend.alerts.rules import HoldDown
from app.backend.contracts import GiB

if TYPE_CHECKING:
    from app.backend.download.manager import DownloadManager
    from app.backend.engine.controller import EngineController
    from app.backend.alerts.notify import Notifier
    from app.backend.telemetry.sampler import TelemetrySampler

DISK_LOW_BYTES = 10 * GiB
DISK_LOW_FRACTION = 0.05
DEBOUNCE_S = 0.5  # let the supervisor's decision follow a failure before the first message names it


@dataclass(frozen=True)
class Condition:
    key: str
    level: int  # a rise in level while active sends one more message (e.g. restarting -> gave up)
    title: str
    body: str = ""
    kind: str = "warning"  # the Apprise notify type of its message: "failure" for a critical one


def _engine_title(text: str) -> str:
    t = text.strip()
    return t if t.lower().startswith("engine") else f"engine {t}"


def engine_conditions(snap: EngineSnapshot) -> list[Condition]:
    """The engine's alert, if any: failed / restarting / stalled (level 1), gave up (level 2)."""
    if snap.desired == "stopped" and snap.state in (EngineState.STOPPED, EngineState.STOPPING):
        return []
    d = snap.diagnosis
    body = f"{d.explanation}\nFix: {d.fix}" if d else ""
    if snap.gave_up:
        return [Condition("engine", 2, _engine_title(snap.message or (d.title if d else "failed")), body, "failure")]
    if snap.state in (EngineState.FAILED, EngineState.STALLED) or (
            snap.restart_try and snap.state is not EngineState.READY):
        return [Condition("engine", 1, _engine_title(snap.message or (d.title if d else snap.state.value)), body,
                          "failure")]
    return []


def decision_pending(snap: EngineSnapshot) -> bool:
    """Failed a moment ago and the supervisor has not said yet whether it restarts: the first message must
    name its plan ("… — restarting, try 1 of 3"), so wait for it."""
    return (snap.state is EngineState.FAILED and snap.desired.startswith("serve:") and not snap.gave_up
            and snap.restart_policy == "on-failure" and snap.restart_try == 0)


def disk_conditions(path: Path) -> list[Condition]:
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        u = shutil.disk_usage(probe)
    except OSError:
        return []
    if u.free < DISK_LOW_BYTES or u.free < u.total * DISK_LOW_FRACTION:
        return [Condition("disk", 1, f"disk low: {u.free / GiB:.1f} GiB free in {probe}",
                          "Downloads and engine logs need room; free space or move the data dir.")]
    return []


class Message(NamedTuple):
    """One notification: `kind` is the Apprise notify type (failure for a critical alert — the engine crashed
    or the supervisor gave up —, warning, success for "resolved", info for the rest)."""

    title: str
    body: str
    kind: str = "info"
    resolved: bool = False  # the end of an announced alert


# The engine and the downloads are told at once and resolved at once: they are the panel's own decisions (the
# supervisor's plan is awaited by `decision_pending`); a crash is never held back.
SERVICE_HOLD_DOWN = {"engine": HoldDown(0.0, 0.0), "download": HoldDown(0.0, 0.0), "disk": HoldDown(60.0, 300.0)}


def condition_hold_down(key: str) -> HoldDown:
    if key.startswith("telemetry:"):
        return alert_rules.hold_down(key.split(":", 1)[1])
    return SERVICE_HOLD_DOWN.get(key, alert_rules.DEFAULT_HOLD_DOWN)


@dataclass
class _Track:
    since: float  # when the condition was first seen in this run of it
    cond: Condition
    announced: bool = False
    clear_since: float | None = None


class AlertTracker:
    """start / escalate / end messages, each once, with a hold-down (docs/telemetry.md#hold-down): a condition
    is announced once it held `start_s`, resolved once it stayed clear `clear_s`; one that clears before it
    was announced is forgotten silently, so "resolved" is only ever sent for what was told. Pure: the caller
    passes the time (`now`, monotonic seconds)."""

    def __init__(self, hold: Callable[[str], HoldDown] = condition_hold_down) -> None:
        self._hold = hold
        self._tracks: dict[str, _Track] = {}

    @property
    def active(self) -> dict[str, Condition]:
        """What a person was told and is not resolved yet."""
        return {k: t.cond for k, t in self._tracks.items() if t.announced}

    def update(self, conditions: Iterable[Condition], ended: Callable[[Condition], str],
               now: float = 0.0) -> list[Message]:
        current = {c.key: c for c in conditions}
        out: list[Message] = []
        for key, c in current.items():
            t = self._tracks.get(key)
            if t is None:
                t = self._tracks[key] = _Track(now, c)
            t.clear_since = None
            if t.announced:
                if c.level > t.cond.level:
                    out.append(Message(c.title, c.body, c.kind))
                t.cond = c if c.level >= t.cond.level else t.cond
            elif now - t.since >= self._hold(key).start_s:
                t.announced, t.cond = True, c
                out.append(Message(c.title, c.body, c.kind))
            else:
                t.cond = c
        for key in [k for k in self._tracks if k not in current]:
            t = self._tracks[key]
            if not t.announced:
                del self._tracks[key]  # a blip shorter than the hold-down: nobody was told, nothing to resolve
                continue
            if t.clear_since is None:
                t.clear_since = now
            if now - t.clear_since >= self._hold(key).clear_s:
                del self._tracks[key]
                out.append(Message(ended(t.cond), "", "success", resolved=True))
        return out


class AlertService:
    """Feeds the tracker from the engine's events and the other sources; sends through the notifier."""

    def __init__(self, notifier: Notifier, *, engine: EngineController | None = None,
                 telemetry: TelemetrySampler | None = None, downloads: DownloadManager | None = None,
                 data_dir: Path | None = None, period_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.notifier = notifier
        self._engine, self._telemetry, self._downloads, self._data_dir = engine, telemetry, downloads, data_dir
        self._period_s = period_s
        self._clock = clock
        self.tracker = AlertTracker()
        self.sent: list[Message] = []  # what was told, for the Service tab and the tests
        self._errors = oplog.Once("service")
        self._was_downloading = False
        self._download_failed = ""
        self._closed = threading.Event()
        self._sub = engine.subscribe() if engine is not None else None
        self._thread = threading.Thread(target=self._run, name="alert-service", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed.is_set():
            if self._sub is not None:
                if self._sub.get(timeout=self._period_s) is not None:
                    while self._sub.get(timeout=DEBOUNCE_S) is not None:  # settle a burst of changes
                        pass
            else:
                self._closed.wait(self._period_s)
            if self._closed.is_set():
                return
            try:
                self.evaluate()
            except Exception as exc:  # an alert source's bug must not end the alerts
                self._errors.caught(exc, "evaluating the alerts")

    def evaluate(self) -> list[Message]:
        conds: list[Condition] = []
        snap = self._engine.snapshot() if self._engine is not None else None
        if snap is not None and decision_pending(snap):
            return []  # the supervisor's decision follows at once (its event wakes the next pass)
        if snap is not None:
            conds += engine_conditions(snap)
        if self._telemetry is not None:
            conds += [Condition(f"telemetry:{a.id}", 1 if a.severity != "critical" else 2, a.title,
                                f"{a.meaning}\nWhat to do: {a.action}",
                                "failure" if a.severity == "critical" else "warning")
                      for a in self._telemetry.alerts if a.severity in ("critical", "warning")]
        if self._data_dir is not None:
            conds += disk_conditions(self._data_dir)
        oneshots: list[Message] = []
        if self._downloads is not None:
            conds_d, oneshots = self._download_conditions()
            conds += conds_d
        out = self.tracker.update(conds, lambda c: self._ended(c, snap), self._clock()) + oneshots
        for m in out:
            self.sent.append(m)
            queued = self.notifier.send(m.title, m.body, m.kind)
            oplog.decision("service", "alert_resolved" if m.resolved else "alert_sent", who=oplog.PANEL,
                           title=m.title, type=m.kind, queued=queued)
        return out

    def _download_conditions(self) -> tuple[list[Condition], list[Message]]:
        """Read the downloads only when a run ends (never polled while idle: an idle panel lists nothing)."""
        assert self._downloads is not None
        running = self._downloads.running
        oneshots: list[Message] = []
        if running:
            self._download_failed = ""
        elif self._was_downloading:
            snap = self._downloads.snapshot()
            failed = [a for a in snap.artifacts if a.state.value == "failed"]
            if failed or snap.error:
                self._download_failed = (snap.error or "; ".join(f"{a.id}: {a.reason}" for a in failed))[:200]
            elif snap.artifacts and all(a.state.value == "done" for a in snap.artifacts):
                oneshots.append(Message("download finished: every artifact verified and extracted", "", "success"))
        self._was_downloading = running
        conds = [Condition("download", 1, f"download failed: {self._download_failed}",
                           "Resume it in the Downloads tab (verified data is kept).")] if self._download_failed else []
        return conds, oneshots

    @staticmethod
    def _ended(c: Condition, snap: EngineSnapshot | None) -> str:
        if c.key == "engine" and snap is not None:
            if snap.state is EngineState.READY:
                return f"engine ready again on {snap.profile_id} — resolved"
            return f"engine alert over: {snap.state.value}" + (" (stopped on purpose)" if snap.desired == "stopped"
                                                                else "")
        return f"{c.title.split(':', 1)[0]} — resolved"

    def close(self) -> None:
        self._closed.set()
        if self._sub is not None:
            self._sub.close()
        self._thread.join(timeout=3.0)
