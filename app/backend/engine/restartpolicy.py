"""The restart policy: which failures a restart can heal, the backoff and the cap (docs/engine.md,
"Keeps serving"). Pure functions over the diagnosis and the restart history; the controller's supervisor
calls `decide()` and acts.

Cap: at most `max_tries` restarts within `window_s` (default 3 in 15 min); the n-th try waits
`backoff_s * 2**(n-1)` (5 s, 10 s, 20 s by default; never more than 300 s). Past the cap: "failed — gave
up" with the diagnosis, until a person starts it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RestartPolicy = Literal["on-failure", "never"]
POLICIES: tuple[RestartPolicy, ...] = ("on-failure", "never")

# Diagnosis classes a restart cannot heal: the same command on the same host fails the same way. Each is
# reported once as "failed — not retried" and waits for a person (docs/engine.md lists them with why).
NON_HEALING: dict[str, str] = {
    "engine_argument_refused": "vLLM refuses the same argument on every start",
    "boot_guard": "the load-time guard refuses the same settings on every start",
    "missing_model_files": "the model files stay missing until downloaded",
    "preflight_failed": "a preflight item (artifacts missing, ckpt pin mismatch, ECC, …) stays failed until fixed",
    "cuda_oom_at_load": "the profile does not fit the GPU; it will not fit on the next try either",
    "wrong_gpu": "the GPU lacks the kernels; no restart adds them",
    "image_missing": "the engine image must be built first",
    "name_conflict": "a foreign container holds the name until someone removes it",
    "pool_not_loaded": "the profile's settings leave no FP4 pool on this GPU: deterministic",
}
MAX_DELAY_S = 300.0


@dataclass(frozen=True)
class PolicyConfig:
    policy: RestartPolicy = "on-failure"
    max_tries: int = 3
    window_s: float = 900.0
    backoff_s: float = 5.0


@dataclass(frozen=True)
class Restart:
    try_no: int  # 1-based
    of: int
    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    why: str  # "not retried: …" or "gave up after 3 tries in 15 min"
    healing: bool  # False: a non-healing class (never retried); True: the cap was reached


Decision = Restart | GiveUp | None  # None: the policy is "never" (nothing to do, nothing to say)


def decide(cfg: PolicyConfig, reason: str, restarts_at: list[float], now: float) -> Decision:
    """What to do about a failure of class `reason`, given the times of the restarts already made.

    Examples:
        >>> decide(PolicyConfig(), "killed", [], 0.0)
        Restart(try_no=1, of=3, delay_s=5.0)
        >>> decide(PolicyConfig(), "cuda_oom_at_load", [], 0.0).healing
        False
    """
    if cfg.policy == "never":
        return None
    if reason in NON_HEALING:
        return GiveUp(f"not retried: {NON_HEALING[reason]}", healing=False)
    recent = [t for t in restarts_at if now - t < cfg.window_s]
    if len(recent) >= cfg.max_tries:
        return GiveUp(f"gave up after {cfg.max_tries} tries in {window_text(cfg.window_s)}", healing=True)
    n = len(recent) + 1
    return Restart(n, cfg.max_tries, min(MAX_DELAY_S, cfg.backoff_s * 2 ** (n - 1)))


def window_text(window_s: float) -> str:
    return f"{window_s / 60:.0f} min" if window_s >= 60 else f"{window_s:.0f} s"


def parse_policy(raw: str) -> RestartPolicy:
    v = raw.strip().lower()
    if v == "on-failure":
        return "on-failure"
    if v == "never":
        return "never"
    raise ValueError(f"restart policy {raw!r}: expected on-failure or never")
