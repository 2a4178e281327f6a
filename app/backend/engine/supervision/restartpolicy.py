"""The restart policy: which failures a restart can heal, the backoff and the cap (docs/engine.md,
"Keeps serving"). Pure functions over the diagnosis and the restart history; the controller's supervisor
calls `decide()` and acts.

Failures are classed per CAUSE, not per stage: a preflight item that heals by itself (Docker away, GPU memory
not yet released, the port briefly held, the image still being built) is a healing cause like a crash, and a
cause that stays (artifacts missing, the ckpt pin, ECC, a refused argument, CUDA OOM at load) is never retried.

Cap: at most `max_tries` restarts within `window_s` (default 3 in 15 min); the n-th try waits
`backoff_s * 2**(n-1)` (5 s, 10 s, 20 s by default; never more than 300 s). Past the cap: "failed — gave
up" with the diagnosis, until a person starts it again. Causes of the box around the engine (ENVIRONMENT)
are outside the cap: retried with the backoff (at most ENV_MAX_DELAY_S apart) for as long as they last —
giving up on Docker that comes back in 20 s would end serving for good.
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
# Causes outside the engine that heal by themselves: retried while they last, never "gave up", never counted
# against the cap (they say nothing about the engine). The delay stays short so serving is back within
# ENV_MAX_DELAY_S + a boot of the cause clearing (the chaos soak's p95 target: docs/engine.md).
ENVIRONMENT: dict[str, str] = {
    "docker_unreachable": "the Docker daemon is unreachable (a restart, an upgrade)",
    "gpu_not_released": "the previous engine's GPU memory is not released yet",
    "port_in_use": "another process holds the engine's port or socket",
    "image_building": "the engine image is being built",
}
ENV_MAX_DELAY_S = 10.0
# Preflight items whose failure heals by itself -> the cause it stands for (any other failed item: the
# preflight failure stays until someone fixes it). "image" heals only while a build runs.
PREFLIGHT_CAUSES: dict[str, str] = {"docker": "docker_unreachable", "gpu_memory": "gpu_not_released",
                                    "port": "port_in_use", "socket_busy": "port_in_use", "image": "image_building"}
NEEDS_DOCKER = frozenset({"image", "nvidia_runtime"})  # items that fail with Docker, not on their own


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


def preflight_cause(blocking_ids: list[str], image_building: bool = False) -> str:
    """The cause a failed preflight stands for: a healing cause when every blocking item heals by itself
    (the first one names it), else "preflight_failed" (never retried).

    Examples:
        >>> preflight_cause(["docker", "nvidia_runtime", "image"])
        'docker_unreachable'
        >>> preflight_cause(["image"])
        'preflight_failed'
        >>> preflight_cause(["port", "artifact:model"])
        'preflight_failed'
    """
    if "docker" in blocking_ids:  # the items read through Docker cannot be judged while it is away
        blocking_ids = [i for i in blocking_ids if i not in NEEDS_DOCKER]
    healing = [i for i in blocking_ids if i in PREFLIGHT_CAUSES and (i != "image" or image_building)]
    if not blocking_ids or len(healing) != len(blocking_ids):
        return "preflight_failed"
    return PREFLIGHT_CAUSES[healing[0]]


def decide(cfg: PolicyConfig, reason: str, restarts_at: list[float], now: float, env_tries: int = 0) -> Decision:
    """What to do about a failure of class `reason`, given the times of the restarts already made and, for an
    ENVIRONMENT cause, how many tries in a row it has had.

    Examples:
        >>> decide(PolicyConfig(), "killed", [], 0.0)
        Restart(try_no=1, of=3, delay_s=5.0)
        >>> decide(PolicyConfig(), "cuda_oom_at_load", [], 0.0).healing
        False
        >>> decide(PolicyConfig(), "docker_unreachable", [0.0, 1.0, 2.0], 3.0, env_tries=7)
        Restart(try_no=8, of=0, delay_s=10.0)
    """
    if cfg.policy == "never":
        return None
    if reason in ENVIRONMENT:  # of=0: no cap
        return Restart(env_tries + 1, 0, min(ENV_MAX_DELAY_S, cfg.backoff_s * 2 ** min(env_tries, 10)))
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
