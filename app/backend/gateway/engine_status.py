"""Whether the engine can take a request now, and why not: the gateway's one question about the engine.

Behind a small interface (`EngineStatusSource`): run by the panel, the gateway is a child process that the
panel tells the engine's status, one JSON line on its stdin per change (`PipeSource`; the panel computes the
line from the reconciler's snapshot with `SnapshotSource` and pushes it on every change event); run on its own
(`moet-panel gateway`) it probes the engine's `/health` and `/v1/models` once a second through the engine
client (`ProbeSource`).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import IO, Protocol


from app.backend import oplog
from app.backend.contracts import SnapshotFn
from app.backend.engine.runtime.readiness import probe
from app.backend.gateway.caps import GatewayCaps


@dataclass(frozen=True)
class EngineStatus:
    ready: bool
    base_url: str  # the engine's server root on loopback, e.g. http://127.0.0.1:8000
    served_name: str = ""
    reason: str = ""  # why not ready: one sentence a client can act on ("" when ready)
    state: str = ""  # the controller's state word (starting, switching, stopped, stalled, ...) when known
    # a stop or switch waits for the answers in flight (docs/engine.md "Keeps serving"): new requests get 503,
    # those running go on to their end
    draining: bool = False
    retry_after_s: float = 0.0  # when the engine is expected back (the 503's Retry-After); 0: unknown, none sent
    slots: int = 0  # sequences the running profile serves at once (--max-num-seqs): the fair queue's slots; 0: unknown
    gpu: int = 0  # the GPU this engine runs on (a box of several: docs/gateway.md "Several GPUs: routing")
    left_out: bool = False  # a self-test or A/B measures on this GPU: the gateway sends it nothing
    # a box of several GPUs: one status per GPU (the fields above are then the box's, routing.box_status)
    engines: tuple[EngineStatus, ...] = ()

    @property
    def accepts(self) -> bool:
        """A new request may go to the engine (on a box of several: to at least one of them)."""
        return self.ready and not self.draining and not self.left_out

    def to_line(self) -> bytes:
        """One JSON line, as the panel writes it to its gateway's stdin (`PipeSource`)."""
        return (json.dumps(asdict(self), separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_line(cls, line: bytes | str) -> EngineStatus:
        """Raises ValueError (json.JSONDecodeError included) for a line that is not one status object."""
        return cls.from_obj(json.loads(line))

    @classmethod
    def from_obj(cls, d: object) -> EngineStatus:
        """The status of one parsed line; raises ValueError when it is not one."""
        return cls._from_dict(d, nested=True)

    @classmethod
    def _from_dict(cls, d: object, nested: bool) -> EngineStatus:
        if not isinstance(d, dict) or not isinstance(d.get("ready"), bool) or not isinstance(d.get("base_url"), str):
            raise ValueError("not an engine status line")
        retry, slots, gpu, engines = d.get("retry_after_s"), d.get("slots"), d.get("gpu"), d.get("engines")
        return cls(d["ready"], d["base_url"], str(d.get("served_name") or ""), str(d.get("reason") or ""),
                   str(d.get("state") or ""), d.get("draining") is True,
                   float(retry) if isinstance(retry, (int, float)) and 0 < retry < 86400 else 0.0,
                   slots if isinstance(slots, int) and not isinstance(slots, bool) and 0 < slots <= 4096 else 0,
                   gpu if isinstance(gpu, int) and not isinstance(gpu, bool) and 0 <= gpu < 1024 else 0,
                   d.get("left_out") is True,
                   tuple(cls._from_dict(e, nested=False) for e in engines)
                   if nested and isinstance(engines, list) and len(engines) <= 64 else ())


class EngineStatusSource(Protocol):
    def status(self) -> EngineStatus:
        """The latest known status; must be cheap (called for every request)."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


_REASONS = {
    "stopped": "the engine is stopped; start it on the panel's Engine tab or with `moet-panel engine start`",
    "preflight": "the engine is starting (preflight checks); try again in a minute",
    "starting": "the engine is starting{phase}; try again in a minute",
    "stopping": "the engine is stopping or switching profile; try again in a minute",
    "failed": "the engine failed{diag}; see the panel's Engine tab",
    "stalled": "the engine is stalled (requests run but no token moves); the panel restarts or diagnoses it",
}


_DRAINING = ("the engine is about to stop or switch profile: answers in flight finish, new requests wait until "
             "it serves again")


def reason_for(state: str, phase: str = "", diagnosis: str = "") -> str:
    text = _REASONS.get(state, f"the engine is {state or 'not ready'}")
    return text.format(phase=f" ({phase})" if phase else "", diag=f": {diagnosis}" if diagnosis else "")


class SnapshotSource:
    """In the panel: the engine controller's snapshot (a dictionary read, no I/O)."""

    def __init__(self, snapshot_fn: SnapshotFn, fallback_base_url: str,
                 slots_for: Callable[[str], int] | None = None, gpu: int = 0):
        self._snapshot_fn = snapshot_fn
        self._gpu = gpu
        self._fallback = fallback_base_url
        self._slots_for = slots_for  # profile id -> its --max-num-seqs (server.engine_slots_of)
        self._slots: dict[str, int] = {}

    def _slots_of(self, profile_id: str | None) -> int:
        if not profile_id or self._slots_for is None:
            return 0
        if profile_id not in self._slots:
            self._slots[profile_id] = self._slots_for(profile_id)
        return self._slots[profile_id]

    def status(self) -> EngineStatus:
        snap = self._snapshot_fn()
        if snap is None:  # no controller: nothing is known to serve
            return EngineStatus(False, self._fallback, "", reason_for(""), "", gpu=self._gpu)
        state = snap.state.value
        base = snap.base_url or self._fallback
        back = max(0.0, float(snap.expected_back_s or 0.0))
        slots = self._slots_of(snap.profile_id)
        if snap.is_ready and snap.draining:
            return EngineStatus(True, base, snap.served_name, _DRAINING, state, draining=True, retry_after_s=back,
                                slots=slots, gpu=self._gpu)
        if snap.is_ready:
            return EngineStatus(True, base, snap.served_name, state=state, slots=slots, gpu=self._gpu)
        diag = snap.diagnosis.title if snap.diagnosis is not None else ""
        return EngineStatus(False, base, snap.served_name, reason_for(state, snap.phase, diag), state,
                            draining=snap.draining, retry_after_s=back, gpu=self._gpu)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


class PipeSource:
    """In the panel's gateway process: the status the panel pushes, one JSON line per change on `stream`
    (the child's stdin), read on a thread. EOF means the panel is gone (stopped, crashed, killed: the kernel
    closes its end of the pipe) and calls `on_eof`, which shuts the gateway down: nothing stays listening
    without the panel. A line that does not parse is skipped (the previous status stands). A `{"caps": …}` line
    is the owner's new caps (caps.py), handed to `on_caps`."""

    def __init__(self, stream: IO[bytes], on_eof: Callable[[], None], fallback_base_url: str = "http://127.0.0.1:8000",
                 on_caps: Callable[[GatewayCaps], None] | None = None):
        self._stream = stream
        self._on_eof = on_eof
        self.on_caps = on_caps
        self._status = EngineStatus(False, fallback_base_url, "", "the gateway has not heard from the panel yet",
                                    "unknown")
        self._thread: threading.Thread | None = None
        self._heard = threading.Event()
        self.updates = 0

    def status(self) -> EngineStatus:
        return self._status

    def feed(self, line: bytes | str) -> None:
        try:
            obj = json.loads(line)
            if isinstance(obj, dict) and "caps" in obj:
                caps = GatewayCaps.from_obj(obj["caps"])
                if self.on_caps is not None:
                    self.on_caps(caps)
                return
            self._status = EngineStatus.from_obj(obj)
            self.updates += 1
            self._heard.set()
        except ValueError as exc:  # the previous status stands
            oplog.caught("gateway", exc, "reading an engine status line from the panel")

    def _read(self) -> None:
        try:
            for line in iter(self._stream.readline, b""):
                self.feed(line)
        except (OSError, ValueError) as exc:  # a closed or broken pipe: the panel is gone all the same
            oplog.caught("gateway", exc, "reading the panel's status pipe")
        self._status = EngineStatus(False, self._status.base_url, self._status.served_name,
                                    "the panel stopped; the gateway is shutting down", "unknown")
        self._heard.set()
        self._on_eof()

    async def start(self, first_within_s: float = 5.0) -> None:
        # a plain thread: a blocking readline() on a pipe, nothing on the event loop's path
        self._thread = threading.Thread(target=self._read, name="gateway-status-pipe", daemon=True)
        self._thread.start()
        # the panel writes the first status before the child listens: serve with it, not with "not heard yet"
        await asyncio.to_thread(self._heard.wait, first_within_s)

    async def stop(self) -> None:
        return None


class ProbeSource:
    """Standalone: `GET /health` then `GET /v1/models` (the served name listed) every `interval_s`."""

    def __init__(self, base_url: str, served_name: str, interval_s: float = 1.0, timeout_s: float = 2.0):
        self.base_url = base_url.rstrip("/")
        self.served_name = served_name
        self._interval = interval_s
        self._timeout = timeout_s
        self._status = EngineStatus(False, self.base_url, served_name, "the gateway has not reached the engine yet", "unknown")
        self._task: asyncio.Task[None] | None = None
        self.checked_at = 0.0

    def status(self) -> EngineStatus:
        return self._status

    async def probe_once(self) -> EngineStatus:
        # The engine client is synchronous and kept alive per base URL (engine/runtime/client.py): one probe a second
        # in a worker thread costs less than a second HTTP stack.
        st = await asyncio.to_thread(self._probe)
        self._status = st
        self.checked_at = time.monotonic()
        return st

    def _probe(self) -> EngineStatus:
        # the engine's one readiness probe (engine/runtime/readiness.py), the controller's too: /health, then /v1/models
        url = self.base_url
        p = probe(url, self.served_name, read_timeout_s=self._timeout)
        if p.models_ok or (p.health_ok and not self.served_name and p.models):
            return EngineStatus(True, url, self.served_name or p.models[0], state="ready")
        if p.health_ok:
            return EngineStatus(False, url, self.served_name,
                                f"the engine does not serve {self.served_name!r} (it lists {list(p.models)}); it may "
                                "be switching", "switching")
        if p.error.startswith("/health answered"):
            return EngineStatus(False, url, self.served_name,
                                f"the engine is starting (its {p.error}); try again in a minute", "starting")
        if self._status.ready:  # once when the engine goes away, not every second while it stays away
            oplog.decision("gateway", "engine_unreachable", who=oplog.PANEL, url=url, error=p.error)
        return EngineStatus(False, url, self.served_name,
                            f"the engine does not answer at {url} ({p.error}): it is stopped or "
                            "starting; start it on the panel's Engine tab or with `moet-panel engine start`",
                            "stopped")

    async def _loop(self) -> None:
        while True:
            await self.probe_once()
            await asyncio.sleep(self._interval)

    async def start(self) -> None:
        await self.probe_once()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            except Exception as exc:
                oplog.caught("gateway", exc, "stopping the engine probe", traceback=True)
