"""What should run, persisted: "serve profile P" or "stopped" (docs/engine.md, "Keeps serving").

Start, stop and switch — from the panel or the CLI, any process on this data dir — record the user's intent
here; the panel's supervisor compares it with what Docker shows and acts (bring back after a reboot,
restart a crash, respect an outside stop). The file is small JSON written atomically (temp file, fsync,
rename, fsync of the directory) so a power cut leaves either the old or the new intent, never half of one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.backend.engine.errlog import ENGINE_ERRORS
from app.backend.files.jsonstore import JsonStore

DesiredKind = Literal["serve", "stopped"]


@dataclass(frozen=True)
class Desired:
    kind: DesiredKind
    profile_id: str | None = None
    set_by: str = ""  # "panel", "CLI", "supervisor (stopped outside the panel)"
    since: float = 0.0
    # the engine build asked for (`--build`, a candidate on some GPUs: docs/engine.md "Upgrading the engine");
    # None: the current build. A supervised restart or a rollback brings back this build, not another.
    build: str | None = None

    @property
    def key(self) -> str:
        """The snapshot's `desired` field: "serve:<profile>" or "stopped"."""
        return f"serve:{self.profile_id}" if self.kind == "serve" else "stopped"


class DesiredStore:
    """`<state_dir>/engine-desired.json`, shared by every panel and CLI on the data dir."""

    def __init__(self, state_dir: Path) -> None:
        self._store = JsonStore(Path(state_dir) / "engine-desired.json", Desired)
        self.path = self._store.path

    def read(self) -> Desired | None:
        d = self._store.read()
        if d is None or (d.kind == "serve" and not d.profile_id):
            return None  # never set, or unreadable: nothing is brought back (the safe side)
        return d

    def write(self, kind: DesiredKind, profile_id: str | None, set_by: str, build: str | None = None) -> Desired:
        d = Desired(kind, profile_id if kind == "serve" else None, set_by, time.time(),
                    build if kind == "serve" else None)
        try:
            self._store.write(d)
        except OSError as exc:  # an unwritable data dir: the operation itself still runs (preflight reports the dir)
            ENGINE_ERRORS.caught(f"recording the desired state in {self.path}", exc)
        return d
