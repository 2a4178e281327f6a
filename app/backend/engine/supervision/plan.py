"""The supervisor's plan (docs/engine.md, "Keeps serving"): what should run (the wish) against what runs (the
snapshot) and what was tried (the restart history) -> one action: bring back, restart with backoff, give up (a
non-healing cause, or the cap), or respect a person's outside stop. Pure; the decider's step calls it
(decider/step.py, `SupervisionPass`). Causes of the box around the engine (Docker away, GPU memory not yet
released, a busy port) are retried while they last and never give up; a clean stop the Docker daemon made (seen
after an outage) is brought back like a reboot's.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.engine.logs.exits import NEUTRAL_REASONS
from app.backend.engine.supervision.restartpolicy import ENVIRONMENT, GiveUp, PolicyConfig, Restart, decide


@dataclass(frozen=True)
class BringBack:
    why: str  # nothing runs though it should (reboot, a daemon restart, never started): at once, not capped


@dataclass(frozen=True)
class RestartLater:
    delay_s: float
    why: str  # the log's and the snapshot's message for the restart itself
    message: str  # shown now ("… — restarting, try 1 of 3 in 5 s")
    try_no: int
    capped: bool  # counts against the cap (an ENVIRONMENT cause does not)


@dataclass(frozen=True)
class Respect:
    message: str  # a clean outside stop while the host and Docker were up: a person's stop


@dataclass(frozen=True)
class GiveUpNow:
    reason: str
    why: str
    message: str


Action = BringBack | RestartLater | Respect | GiveUpNow | None


def plan(snap: EngineSnapshot, profile_id: str, cfg: PolicyConfig, recent: list[float], env_tries: int,
         now: float, *, stopped_by_reboot: bool) -> Action:
    """What to do about a STOPPED/FAILED engine that should serve `profile_id` (pure).

    `recent`: the times of the capped restarts made for this wish; `env_tries`: tries in a row of an ENVIRONMENT
    cause."""
    d = snap.diagnosis
    reason = d.reason if d else ""
    if snap.state is EngineState.STOPPED and not snap.container_id and not reason:
        return BringBack(f"bringing back {profile_id} (it should run; nothing runs)")
    if stopped_by_reboot:
        return BringBack(f"bringing back {profile_id} (stopped by the host's reboot)")
    if reason == "docker_restarted":
        return BringBack(f"bringing back {profile_id} (stopped while Docker was unreachable)")
    if snap.state is EngineState.STOPPED:
        if reason in NEUTRAL_REASONS:
            return Respect(f"{snap.message or 'stopped outside the panel'} — respected: desired state is now stopped")
        return None
    title = d.title if d else snap.message
    verdict = decide(cfg, reason, recent, now, env_tries)
    if isinstance(verdict, GiveUp):
        return GiveUpNow(reason, verdict.why, f"{title} — failed, {verdict.why}")
    if isinstance(verdict, Restart):
        env = reason in ENVIRONMENT
        of = "" if env else f" of {verdict.of}"
        when = f" in {verdict.delay_s:.0f} s" if verdict.delay_s >= 1 else ""
        heals = f" (retried while {ENVIRONMENT[reason]})" if env else ""
        return RestartLater(verdict.delay_s, f"restarting {profile_id} after: {title} (try {verdict.try_no}{of})",
                            f"{title} — restarting, try {verdict.try_no}{of}{when}{heals}", verdict.try_no, not env)
    return None
