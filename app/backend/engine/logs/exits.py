"""Explain an exited engine from what Docker kept: the one exit classifier (docs/engine.md, "Exits").

Used by the live panel (an engine that exits while it watches), by a panel that starts after the exit
(restart, reboot) and by `moet-panel engine status` in a fresh process: all three read the same facts —
exit code, `OOMKilled`, `State.Error`, the finish time and the persisted log tail — and get the same
answer. Text rules live in `diagnosis.classify`; this module adds what only the container record tells
(SIGKILL vs a clean stop, the daemon's own error) and decides whether the exit is a failure at all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from app.backend.engine.logs.diagnosis import classify
from app.backend.engine.runtime.base import Instance
from app.backend.contracts import Diagnosis

SIGKILL_CODES = (137, -9)
SIGTERM_CODES = (0, 143, -15)
# Exits that are not failures: the engine was stopped or removed on purpose, just not by this panel.
NEUTRAL_REASONS = frozenset({"stopped_outside_panel", "removed_outside_panel"})

STOPPED_OUTSIDE = Diagnosis(
    "stopped_outside_panel", "stopped outside the panel",
    "The engine shut down cleanly on SIGTERM (e.g. `docker stop`, `moet-panel engine stop`, a host shutdown).",
    "Nothing is broken: start it again from the Engine tab (or `moet-panel engine start --profile ID`).",
)
REMOVED_OUTSIDE = Diagnosis(
    "removed_outside_panel", "engine container removed outside the panel",
    "The panel's engine container disappeared (`docker rm -f`, or another panel/CLI replaced it); Docker kept "
    "no exit record to read.",
    "Start it again when you want it (`moet-panel engine start --profile ID`); `moet-panel engine logs` shows the "
    "saved log of that run.",
)


def killed_sigkill(finished_at: str = "") -> Diagnosis:
    """SIGKILL with no OOM line in the log: the host OOM killer is the usual suspect on a small host."""
    when = f" at {finished_at[:19].replace('T', ' ')} UTC" if finished_at else ""
    since = f" --since '{finished_at[:19].replace('T', ' ')}'" if finished_at else ""
    return Diagnosis(
        "killed", "killed (SIGKILL, exit 137)",
        f"The engine received SIGKILL{when}. On this model that is most often the host's OOM killer: a planes-cache "
        "MISS re-stages the checkpoint (~51 GiB host RAM) and a host below the card's ~64 GB guidance is killed with "
        "no moe_w2 line to explain it. Otherwise someone ran `docker kill` / `docker rm -f`, or a stop ran past its "
        "grace period.",
        f"Confirm it: `journalctl -k{since} | grep -i -E 'out of memory|oom-kill'` (or `sudo dmesg -T | grep -i oom`)"
        " names the killed process; compare host RAM (`free -g`) with the card's ~64 GB. If it was the OOM killer, "
        "pin VLLM_MOE_W2_CKPT_ID so the planes cache hits, or add host RAM; then start again.",
    )


def explain_exit(inst: Instance | None, lines: Iterable[str], *, cache_miss: bool = False) -> Diagnosis:
    """Why this panel engine is no longer running. `inst` None = the container is gone (removed)."""
    tail = [ln for ln in lines if ln.strip()]
    if inst is None:
        return REMOVED_OUTSIDE
    if inst.error:
        tail.append(f"Docker: {inst.error}")
    code = inst.exit_code
    d = classify(code, inst.oom_killed, tail, cache_miss=cache_miss)
    if d.reason == "killed" or (d.reason == "unexpected_exit" and code in SIGKILL_CODES):
        k = killed_sigkill(inst.finished_at)
        return Diagnosis(k.reason, k.title, k.explanation, k.fix, d.evidence or tuple(tail[-3:]))
    if d.reason == "stopped_outside_panel" or (d.reason == "unexpected_exit" and code in SIGTERM_CODES
                                               and not inst.error):
        return Diagnosis(STOPPED_OUTSIDE.reason, STOPPED_OUTSIDE.title, STOPPED_OUTSIDE.explanation,
                         STOPPED_OUTSIDE.fix, d.evidence)
    if inst.error and d.reason == "unexpected_exit":
        return Diagnosis(d.reason, f"Engine failed to run: {inst.error[:120]}", "Docker reported an error for the "
                         "container itself (State.Error), not the engine.", "Read the error; fix the Docker/runtime "
                         "setup it names, then start again.", (f"Docker: {inst.error}",))
    return d


def is_failure(d: Diagnosis) -> bool:
    return d.reason not in NEUTRAL_REASONS


class ExitRecords:
    """Failures the panel itself judged (pool not loaded, boot timeout: Docker's record shows only a stop), kept
    in `<state_dir>/engine-exits/<container>.json` so a fresh process explains that run the same way."""

    KEEP = 20

    def __init__(self, state_dir: Path) -> None:
        self.directory = Path(state_dir) / "engine-exits"

    def _path(self, cid: str) -> Path:
        return self.directory / f"{cid[:64]}.json"

    def record(self, cid: str, d: Diagnosis) -> None:
        try:
            path = self._path(cid)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"reason": d.reason, "title": d.title, "explanation": d.explanation,
                                        "fix": d.fix, "evidence": list(d.evidence)}), encoding="utf-8")
            for old in sorted(self.directory.glob("*.json"), key=lambda p: p.stat().st_mtime)[:-self.KEEP]:
                old.unlink(missing_ok=True)
        except OSError:
            pass  # unwritable data dir: the live panel still shows it

    def read(self, cid: str) -> Diagnosis | None:
        try:
            raw = json.loads(self._path(cid).read_text(encoding="utf-8"))
            return Diagnosis(raw["reason"], raw["title"], raw["explanation"], raw["fix"], tuple(raw["evidence"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None
