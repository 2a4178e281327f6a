"""The gateway as a panel service: one switch (off → on → off), its state, the keys and the activity.

The panel's Access tab calls this; the gateway reads the engine through the controller's snapshot
(`SnapshotSource`), never by probing it. Keys created here are the same keys `moet-panel keys` manages
(one SQLite file in the state dir).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

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


class GatewayService:
    def __init__(self, state_dir: Path, config: GatewayConfig, snapshot_fn: Callable[[], Any], engine_base_url: str):
        self.keys = KeyStore(state_dir)
        self.config = config
        self._source = SnapshotSource(snapshot_fn, engine_base_url)
        self._lock = threading.Lock()
        self._server: GatewayServer | None = None
        self._snap = GatewaySnapshot(GatewayState.OFF, message="off: other machines cannot reach the model")

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
            self._snap = GatewaySnapshot(GatewayState.ON, url=server.url, message=f"on at {server.url}")
            return self.snapshot()

    def stop(self) -> GatewaySnapshot:
        with self._lock:
            server, self._server = self._server, None
            if server is not None:
                server.stop()
            self._snap = GatewaySnapshot(GatewayState.OFF, message="off: other machines cannot reach the model")
            return self.snapshot()

    def create_key(self, name: str, expires_days: float | None = None) -> CreatedKey:
        return self.keys.create(name, expires_days)

    def revoke_key(self, name: str) -> bool:
        return self.keys.revoke(name)

    def list_keys(self) -> list[KeyInfo]:
        return self.keys.infos()

    def activity(self, limit: int = 50) -> list[ActivityRecord]:
        return self.keys.activity(limit)

    def close(self) -> None:
        self.stop()
        self.keys.close()
