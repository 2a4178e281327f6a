"""The gateway as a panel service: one switch (off → on → off), its state, the keys and the activity.

The panel's Access tab calls this; the gateway reads the engine through the controller's snapshot
(`SnapshotSource`), never by probing it. Keys created here are the same keys `moet-panel keys` manages
(one SQLite file in the state dir).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from app.backend.contracts import SnapshotFn
from app.backend.gateway.keys import ActivityRecord, CreatedKey, KeyInfo, KeyStore
from app.backend.gateway.readiness import SnapshotSource
from app.backend.gateway.server import GatewayConfig, GatewayConfigError, GatewayServer


class GatewayState(str, Enum):
    OFF = "off"
    STARTING = "starting"
    ON = "on"
    FAILED = "failed"


@dataclass(frozen=True)
class GatewaySnapshot:
    state: GatewayState
    url: str = ""  # where clients connect (when on)
    message: str = ""  # why it failed, or what it is doing
    engine_ready: bool = False
    engine_reason: str = ""


@dataclass(frozen=True)
class GatewayView:
    snapshot: GatewaySnapshot
    keys: tuple[KeyInfo, ...]
    activity: tuple[ActivityRecord, ...]


class GatewayService:
    def __init__(self, state_dir: Path, config: GatewayConfig, snapshot_fn: SnapshotFn, engine_base_url: str):
        self.keys = KeyStore(state_dir)
        self.config = config
        self._source = SnapshotSource(snapshot_fn, engine_base_url)
        self._lock = threading.Lock()
        self._server: GatewayServer | None = None
        self._snap = GatewaySnapshot(GatewayState.OFF, url=config.url(), message="off: other machines cannot reach the model")
        self._view: GatewayView | None = None
        self._view_at = 0.0

    def snapshot(self) -> GatewaySnapshot:
        st = self._source.status()
        snap = self._snap
        server = self._server
        if snap.state is GatewayState.ON and server is not None and server.error:
            snap = self._snap = GatewaySnapshot(GatewayState.FAILED, message=f"the gateway stopped: {server.error}")
        return replace(snap, engine_ready=st.ready, engine_reason=st.reason)

    def start(self, port: int | None = None) -> GatewaySnapshot:
        """Start serving (idempotent); a refused configuration leaves it off with the reason."""
        with self._lock:
            if self._server is not None:
                return self.snapshot()
            cfg = self.config if port is None else replace(self.config, port=port)
            self._snap = GatewaySnapshot(GatewayState.STARTING, message="starting")
            try:
                server = GatewayServer(cfg, self.keys, self._source)
            except GatewayConfigError as exc:
                self._snap = GatewaySnapshot(GatewayState.FAILED, message=str(exc))
                return self.snapshot()
            server.start()
            if not server.wait_started(10):
                server.stop(2)
                self._snap = GatewaySnapshot(GatewayState.FAILED, message=server.error or "the gateway did not start")
                return self.snapshot()
            self._server = server
            self._snap = GatewaySnapshot(GatewayState.ON, url=server.url, message="serving: clients need a key (Authorization: Bearer …)")
            return self.snapshot()

    def stop(self) -> GatewaySnapshot:
        with self._lock:
            server, self._server = self._server, None
            if server is not None:
                server.stop()
            self._snap = GatewaySnapshot(GatewayState.OFF, url=self.config.url(),
                                         message="off: other machines cannot reach the model")
            return self.snapshot()

    def create_key(self, name: str, expires_days: float | None = None) -> CreatedKey:
        created = self.keys.create(name, expires_days)
        self._invalidate()
        return created

    def revoke_key(self, name: str) -> bool:
        ok = self.keys.revoke(name)
        self._invalidate()
        return ok

    def list_keys(self) -> list[KeyInfo]:
        return self.keys.infos()

    def activity(self, limit: int = 50) -> list[ActivityRecord]:
        return self.keys.activity(limit)

    def view(self, max_age_s: float = 2.0) -> GatewayView:
        """Snapshot, keys with usage and recent activity for a page timer: read from the file at most every
        `max_age_s` (a key created or revoked here refreshes it at once)."""
        now = time.monotonic()
        with self._lock:
            cached = self._view
            if cached is not None and now - self._view_at < max_age_s:
                return replace(cached, snapshot=self.snapshot())
        view = GatewayView(self.snapshot(), tuple(self.keys.infos()), tuple(self.keys.activity(50)))
        with self._lock:
            self._view, self._view_at = view, now
        return view

    def _invalidate(self) -> None:
        with self._lock:
            self._view = None

    def close(self) -> None:
        self.stop()
        self.keys.close()
