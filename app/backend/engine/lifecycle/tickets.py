"""Operation tickets, controller options and the pool expectation rule (shared by controller parts)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from app.backend.contracts import Diagnosis
from app.backend.contracts import GiB


@dataclass
class Ticket:
    """Handle on one requested operation. `accepted=False` means refused (see `message`)."""

    id: int
    action: str
    profile_id: str | None
    accepted: bool
    message: str = ""
    ok: bool | None = None
    diagnosis: Diagnosis | None = None
    started: float = field(default_factory=time.time)
    finished: float | None = None
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the operation finished; True if it did within the timeout."""
        return self._done.wait(timeout)

    @property
    def done(self) -> bool:
        return self._done.is_set()


@dataclass
class ControllerOptions:
    auto_rollback: bool = True
    poll_interval_s: float = 0.25
    pool_line_grace_s: float = 5.0  # after health+models, how long to wait for the pool line
    gpu_release_timeout_s: float = 120.0
    gpu_release_bytes: int = 2 * GiB  # serverctl's threshold: < 2048 MiB used before the next boot
    extra_env: dict[str, str] = field(default_factory=dict)
    extra_labels: dict[str, str] = field(default_factory=dict)
    reattach: bool = True  # False: no adoption and no Docker watch at all (unit tests of one operation)
    actor: str = "panel"  # who this process is in the engine lock ("panel" or "CLI")
    resync_s: float = 2.0  # full re-read of the panel's containers, the safety net under Docker events
    liveness_poll_s: float = 1.0  # /metrics read for the stall check while ready
    stall_after_s: float | None = None  # None = the recipe's engine.stall_after_s
    restart_on_stall: bool | None = None  # None = the recipe's engine.restart_on_stall (or the policy, supervised)
    # Supervision (docs/engine.md, "Keeps serving"): the panel supervises (brings back what should run, restarts
    # crashes); a CLI call or a test controller only records the desired state.
    supervise: bool = False
    restart_policy_fn: Callable[[], str] | None = None  # None = the recipe's engine.restart
    restart_max_tries: int = 3
    restart_window_s: float = 900.0
    restart_backoff_s: float = 5.0
    boot_time_fn: Callable[[], float] | None = None  # None = psutil.boot_time (tests inject a reboot)
    canary_interval_s: float | None = None  # None = the recipe's engine.canary_interval_s (supervised only)
    canary_timeout_s: float | None = None
    image_building_fn: Callable[[], bool] | None = None  # a build of the engine image runs: "image missing" heals
    # Drain (docs/engine.md "Keeps serving"): a stop/switch waits up to this for the answers in flight; None =
    # drain_grace_fn, else the recipe's engine.drain_grace_s
    drain_grace_s: float | None = None
    drain_grace_fn: Callable[[], float | None] | None = None  # the Service tab's setting (None: not set there)
    # The GPU this controller's engine runs on, on a box of several (engine/gpus.py; docs/engine.md "Several
    # GPUs"); None: the recipe's one engine, exactly as written.
    gpu: int | None = None
    box_engines: int = 1  # engines the box runs (preflight's host share for N engines)


def expects_pool(env: dict[str, str], pool_line: str = "from_env") -> bool:
    """Does this env ask for an FP4 delta pool (docs/engine.md, "Engine facts")? A recipe's `engine.pool_line = "never"`
    (an engine without the pool, e.g. upstream vLLM) says no whatever the env holds."""
    if pool_line == "never":
        return False
    if env.get("VLLM_MOE_W2", "0") != "1" or env.get("VLLM_MOE_W2_DELTA", "1") == "0":
        return False
    raw = env.get("VLLM_MOE_W2_DELTA_GB", "2.0").strip().lower()
    if raw in ("auto", "-1", "-1.0"):
        return True
    try:
        return float(raw) > 0
    except ValueError:
        return True  # unparsable: the engine decides; demand the pool line
