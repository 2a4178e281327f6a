"""Which engine takes a request: the gateway's one choice of engine, behind one small interface
(docs/gateway.md "Several GPUs: routing").

A box of several GPUs runs one engine per GPU (docs/engine.md "Several GPUs"). The engine status the gateway
reads (readiness.EngineStatus) is then the box's: `accepts` when ANY engine does, `slots` the sum of the
accepting engines' sequences (the fair queue's slots), and `engines` one status per GPU. After the fair queue
hands a request a slot, `Chooser.pick` names the engine: a ready one, not draining, not left out (a self-test or
an A/B measuring on it), with a free sequence, the least busy first. A one-GPU box has no `engines` list: the
one engine is picked, exactly as before.

Beyond one box the plan is not a home-made cluster: an existing router (vLLM's own `vllm-router`, with
cache-aware and power-of-two balancing, as GPUStack bundles it) in front of each box's gateway; this interface
stays the one place a box picks among its own GPUs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from app.backend.contracts import SnapshotFn
from app.backend.gateway.engine_status import EngineStatus, SnapshotSource


@dataclass(frozen=True)
class Target:
    """The engine a request goes to: its GPU (None on a one-GPU box) and address."""

    gpu: int | None
    base_url: str


class Chooser(Protocol):
    def pick(self, box: EngineStatus, avoid: Iterable[str] = ()) -> Target | None:
        """The engine for the next request (None: none accepts); `avoid`: addresses that just failed to answer."""
        ...

    def began(self, target: Target) -> None: ...

    def ended(self, target: Target) -> None: ...

    def in_flight(self, gpu: int | None) -> int:
        """Answers running on that GPU's engine now (its drain waits for them)."""
        ...


class LeastBusy:
    """Pick the accepting engine with the fewest answers in flight relative to its sequences; ties: the lowest GPU."""

    def __init__(self) -> None:
        self._running: dict[str, int] = {}  # base_url -> requests in flight there
        self._by_gpu: dict[int | None, int] = {}

    def pick(self, box: EngineStatus, avoid: Iterable[str] = ()) -> Target | None:
        skip = set(avoid)
        if not box.engines:  # a one-GPU box: the one engine
            return Target(None, box.base_url) if box.accepts and box.base_url not in skip else None
        best: tuple[float, int, EngineStatus] | None = None
        for e in box.engines:
            if not e.accepts or e.base_url in skip:
                continue
            load = self._running.get(e.base_url, 0) / max(1, e.slots or 1)
            if best is None or (load, e.gpu) < (best[0], best[1]):
                best = (load, e.gpu, e)
        return Target(best[2].gpu, best[2].base_url) if best is not None else None

    def began(self, target: Target) -> None:
        self._running[target.base_url] = self._running.get(target.base_url, 0) + 1
        self._by_gpu[target.gpu] = self._by_gpu.get(target.gpu, 0) + 1

    def ended(self, target: Target) -> None:
        self._running[target.base_url] = max(0, self._running.get(target.base_url, 0) - 1)
        self._by_gpu[target.gpu] = max(0, self._by_gpu.get(target.gpu, 0) - 1)

    def in_flight(self, gpu: int | None) -> int:
        return self._by_gpu.get(gpu, 0)


def box_status(engines: list[EngineStatus]) -> EngineStatus:
    """The box's status from one status per GPU (each with its `gpu`): see the module docstring. One engine: that
    engine's status, unchanged."""
    if len(engines) == 1:
        return replace(engines[0], engines=())
    serving = [e for e in engines if e.accepts]
    if serving:
        first = serving[0]
        return EngineStatus(True, first.base_url, first.served_name, state="ready",
                            slots=sum(e.slots or 1 for e in serving), engines=tuple(engines))
    draining = any(e.draining for e in engines)
    backs = [e.retry_after_s for e in engines if e.retry_after_s > 0]
    reasons = "; ".join(f"GPU {e.gpu}: {e.reason or e.state or 'not ready'}" for e in engines)
    head = engines[0]
    return EngineStatus(False, head.base_url, head.served_name,
                        f"no GPU serves now ({reasons})", head.state, draining=draining,
                        retry_after_s=min(backs) if backs else 0.0, engines=tuple(engines))


class BoxSource:
    """In the panel (or a bench) of a box of several GPUs: each GPU's engine controller's snapshot, as the box's
    status (routing.box_status); `left_out_fn`: the GPUs a self-test or A/B measures on (sent nothing)."""

    def __init__(self, sources: list[SnapshotSource], left_out_fn: Callable[[], set[int]] | None = None):
        self._sources = sources
        self._left_out_fn = left_out_fn

    def status(self) -> EngineStatus:
        out = self._left_out_fn() if self._left_out_fn is not None else set()
        each = [s.status() for s in self._sources]
        return box_status([replace(e, left_out=e.gpu in out) if out else e for e in each])

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def box_source(gpus: list[int], snapshot_of: Callable[[int], SnapshotFn], base_url_of: Callable[[int | None], str],
               slots_for: Callable[[str], int] | None = None,
               left_out_fn: Callable[[], set[int]] | None = None) -> SnapshotSource | BoxSource:
    """The gateway's one engine-status source, whichever way it runs (docs/gateway.md "One gateway"): each GPU's
    engine controller's snapshot — what Docker (or the process runtime) shows, with the readiness probe, and the
    drains of ANY process (a controller mirrors another process's drain note, engine/drainnote.py). The panel
    computes it from its controllers and pushes it to its gateway process; `moet-panel gateway` computes it in its
    own process, from controllers of its own that only observe. `gpus`: the box's (engine/gpus.py `BoxGpus.gpus`);
    `snapshot_of(gpu)`: that GPU's controller's snapshot function; `base_url_of(gpu)`: where that engine listens
    when its snapshot does not say (None: the one engine of a one-GPU box)."""
    if len(gpus) == 1:
        return SnapshotSource(snapshot_of(gpus[0]), base_url_of(None), slots_for)
    return BoxSource([SnapshotSource(snapshot_of(g), base_url_of(g), slots_for, gpu=g) for g in gpus],
                       left_out_fn=left_out_fn)
