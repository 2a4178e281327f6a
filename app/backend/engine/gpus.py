"""One engine per GPU: the box's engines behind one small facade (docs/engine.md, "Several GPUs").

The card's artifacts are single-GPU (TP1), so a box of N GPUs serves with N copies of the recipe's one-GPU
engine, one per GPU: `--gpus "device=N"`, its own container name, socket (or port), log, diagnosis, canary,
restart record and desired state (`recipe.command.build_run_spec(gpu=N)`, `controller.engine_state_dir`).

Writers: each GPU's engine is its own `EngineController`, whose reconciler thread is the ONE writer of that
GPU's snapshot (per-GPU state, one writer each: the house rule holds per piece of state). The BoxGpus writes no
engine state at all: it only routes each ask to the controller(s) of the GPUs named and, for a rolling switch,
asks them one at a time. A one-GPU box is one controller built exactly as before (`gpu=None`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from app.backend import oplog
from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.engine.controller import EngineController
from app.backend.engine.lifecycle.tickets import Ticket

# the longest a rolling switch waits for the other processes' gateways to see the GPU it just booted (their
# readiness probe's lag: seconds under load); past it the roll goes on (docs/engine.md "Several GPUs")
ROLL_WAIT_S = 30.0

ALL = "all"


class GpuSelectionError(ValueError):
    """A --gpu value that names no GPU of this box."""


def parse_gpus(text: str | None, available: Iterable[int], flag: str = "--gpu") -> list[int]:
    """`all` (or empty) -> every GPU of the box; `0,2` -> those, in order, each once. Raises GpuSelectionError
    with what the box has."""
    have = sorted(available)
    raw = (text or ALL).strip().lower()
    if raw == ALL:
        return have
    out: list[int] = []
    for part in raw.split(","):
        part = part.strip()
        if not part.isdigit():
            raise GpuSelectionError(f"{flag} {text!r}: expected all or GPU numbers like 0,1 (this box has "
                                    f"{', '.join(map(str, have))})")
        n = int(part)
        if n not in have:
            raise GpuSelectionError(f"{flag} {text!r}: GPU {n} is not one of this box's ({', '.join(map(str, have))})")
        if n not in out:
            out.append(n)
    return out


@dataclass(frozen=True)
class EngineRow:
    """One GPU's engine as status shows it."""

    gpu: int
    snapshot: EngineSnapshot

    def as_dict(self) -> dict[str, object]:
        s = self.snapshot
        return {"gpu": self.gpu, "state": s.state.value, "profile": s.profile_id, "listens": s.base_url,
                "container": s.container_name, "phase": s.phase, "simulated": s.simulated}


@dataclass(frozen=True)
class RollStep:
    """One GPU's part in a rolling switch: its ticket; None when it already served the profile (`skipped`) or
    the roll stopped before it."""

    gpu: int
    ticket: Ticket | None
    skipped: bool = False

    @property
    def ok(self) -> bool:
        return self.skipped or (self.ticket is not None and self.ticket.accepted and self.ticket.ok is True)


class BoxGpus:
    """The box's engines, one controller per GPU (see the module docstring). GPU numbers are the driver's."""

    def __init__(self, controllers: dict[int, EngineController],
                 others_serving: Callable[[], list[list[int]]] | None = None) -> None:
        """`others_serving`: what the other processes' gateways send to now (answers.OtherPublishers.serving)."""
        if not controllers:
            raise ValueError("a box needs at least one engine")
        self._ctl = dict(sorted(controllers.items()))
        self._others_serving = others_serving
        # GPUs a self-test or blind A/B measures on: the gateway sends them nothing meanwhile (docs/gateway.md).
        # Written only by leave_out/take_back, under this lock; read as a copy.
        self._left_out: dict[int, str] = {}
        self._left_lock = threading.Lock()
        self._rolling = threading.Lock()  # one rolling switch at a time

    def leave_out(self, gpus: Iterable[int], why: str, *, who: str = oplog.PANEL) -> None:
        """The gateway sends these GPUs nothing new (their answers in flight go on) until `take_back`."""
        with self._left_lock:
            for g in gpus:
                self._left_out[g] = why
        oplog.decision("engine", "leave out of the gateway", who=who, gpus=",".join(map(str, gpus)), why=why)

    def take_back(self, gpus: Iterable[int], *, who: str = oplog.PANEL) -> None:
        with self._left_lock:
            for g in gpus:
                self._left_out.pop(g, None)
        oplog.decision("engine", "back in the gateway", who=who, gpus=",".join(map(str, gpus)))

    def left_out(self) -> set[int]:
        with self._left_lock:
            return set(self._left_out)

    @property
    def gpus(self) -> list[int]:
        return list(self._ctl)

    def controller(self, gpu: int) -> EngineController:
        return self._ctl[gpu]

    def select(self, text: str | None) -> list[int]:
        return parse_gpus(text, self._ctl)

    def rows(self) -> list[EngineRow]:
        return [EngineRow(g, c.snapshot()) for g, c in self._ctl.items()]

    def serving(self) -> list[int]:
        """The GPUs whose engine is ready now."""
        return [r.gpu for r in self.rows() if r.snapshot.state is EngineState.READY]

    def start(self, profile_id: str, gpus: list[int], overrides: tuple[str, ...] = (), *,
              who: str = oplog.PANEL, build: str | None = None) -> list[tuple[int, Ticket]]:
        """Start the profile on each GPU named, all at once (each engine boots on its own GPU); `build`: the
        engine build to run there (a candidate on one GPU while the others serve the current one)."""
        return [(g, self._ctl[g].start(profile_id, overrides, who=who, build=build)) for g in gpus]

    def stop(self, gpus: list[int], *, who: str = oplog.PANEL) -> list[tuple[int, Ticket]]:
        return [(g, self._ctl[g].stop(who=who)) for g in gpus]

    def start_rolling_switch(self, profile_id: str, gpus: list[int], *, who: str = oplog.PANEL,
                             build: str | None = None) -> str:
        """`rolling_switch` on a thread of its own (the Engine tab); refused while another roll runs. Returns what
        to tell the person."""
        if self._rolling.locked():
            return "refused: a rolling switch is already under way"

        def roll() -> None:
            self.rolling_switch(profile_id, gpus, who=who, build=build)

        threading.Thread(target=roll, name="engine-rolling-switch", daemon=True).start()
        return (f"rolling switch to {profile_id} on GPUs {', '.join(map(str, gpus))}: one GPU at a time, each drained, "
                "switched and ready before the next (the rows above follow it)")

    def rolling_switch(self, profile_id: str, gpus: list[int], overrides: tuple[str, ...] = (), *,
                       who: str = oplog.PANEL, timeout_s: float | None = None,
                       on_step: Callable[[int, Ticket], None] | None = None, build: str | None = None) -> list[RollStep]:
        """Switch the GPUs named to the profile ONE AT A TIME: each controller drains its engine (its answers in
        flight finish), stops it, boots the profile and gates on ready; only then the next GPU. A GPU whose
        switch fails ends the roll there (it rolled back, or stands failed), so the GPUs not yet switched keep
        serving the old profile; the steps after it carry no ticket. One roll at a time (a second waits)."""
        with self._rolling:
            return self._roll(profile_id, gpus, overrides, who, timeout_s, on_step, build)

    def _roll(self, profile_id: str, gpus: list[int], overrides: tuple[str, ...], who: str, timeout_s: float | None,
              on_step: Callable[[int, Ticket], None] | None, build: str | None = None) -> list[RollStep]:
        steps: list[RollStep] = []
        oplog.decision("engine", "rolling switch", who=who, profile=profile_id, gpus=",".join(map(str, gpus)))
        for i, g in enumerate(gpus):
            ctl = self._ctl[g]
            snap = ctl.snapshot()
            if snap.state is EngineState.READY and snap.profile_id == profile_id and (build is None or snap.build == build):
                steps.append(RollStep(g, None, skipped=True))  # already serves it: nothing to take away
                continue
            live = snap.state in (EngineState.READY, EngineState.FAILED)
            if live:
                self._others_keep_serving(g, who)
            t = (ctl.switch(profile_id, overrides, who=who, build=build) if live
                 else ctl.start(profile_id, overrides, who=who, build=build))
            if t.accepted:
                t.wait(timeout_s)
            step = RollStep(g, t)
            steps.append(step)
            if on_step is not None:
                on_step(g, t)
            if not step.ok:
                steps += [RollStep(rest, None) for rest in gpus[i + 1:]]
                break
        return steps

    def _others_keep_serving(self, gpu: int, who: str) -> None:
        """Before GPU `gpu` is taken out: wait until every other process's gateway (a standalone gateway; the panel's
        when the roll is the CLI's) sees a GPU other than it serving. Their view of the engine this roll just booted
        lags by their own readiness probe; taking `gpu` out before that left such a gateway refusing every request
        for seconds (seen: 3,630 refused in a loaded run). Bounded: a gateway that never sees another GPU (its own
        fault) does not hold the roll."""
        if self._others_serving is None:
            return
        t0 = time.monotonic()
        while True:
            stuck = [s for s in self._others_serving() if s and set(s) <= {gpu}]
            waited = time.monotonic() - t0
            if not stuck or waited >= ROLL_WAIT_S:
                break
            time.sleep(0.1)  # another process's view: only its published file says it
        if waited >= 0.1:
            oplog.decision("engine", "rolling switch waited for other gateways", who=who, gpu=gpu,
                           waited_s=round(waited, 1), gave_up=bool(stuck))

    def close(self) -> None:
        for c in self._ctl.values():
            c.close()


def build_box_gpus(count: int, make: Callable[[int | None], EngineController],
                   others_serving: Callable[[], list[list[int]]] | None = None) -> BoxGpus:
    """`make(gpu)` builds one controller; a one-GPU box gets `make(None)`: the engine exactly as before."""
    if count <= 1:
        return BoxGpus({0: make(None)})
    return BoxGpus({g: make(g) for g in range(count)}, others_serving)
