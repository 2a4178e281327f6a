"""GPUs left out of the gateway, seen from another process on the same data dir (docs/gateway.md "One gateway").

A self-test or a blind A/B measuring on a GPU of a box of several leaves that GPU out of the gateway: it gets no
API answer meanwhile, so the measure is the profile's alone (engine/gpus.py `BoxGpus.leave_out`). That is in the
measuring process's memory; a `moet-panel gateway` beside the panel is another process. So the process that leaves
GPUs out says which in a file of its own, `<state dir>/left-out-<pid>.json` (written on change, removed when it
closes), and a gateway reads the other live processes' (at most every `MAX_AGE_S`: a request never waits on the
disk). A writer that died counts for nothing.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.backend import oplog
from app.backend.files.atomic import pid_alive
from app.backend.files.jsonstore import JsonStore

PREFIX = "left-out"
MAX_AGE_S = 0.5


@dataclass(frozen=True)
class LeftOut:
    pid: int
    gpus: list[int] = field(default_factory=list)


class LeftOutNotes:
    def __init__(self, state_dir: Path) -> None:
        self._dir = Path(state_dir)
        self._own = JsonStore(self._dir / f"{PREFIX}-{os.getpid()}.json", LeftOut)
        self._stores: dict[Path, JsonStore[LeftOut]] = {}
        self._lock = threading.Lock()
        self._seen: tuple[float, set[int]] = (-MAX_AGE_S, set())

    def publish(self, gpus: set[int]) -> None:
        """This process leaves `gpus` out (an empty set: none; the file goes)."""
        try:
            if gpus:
                self._own.write(LeftOut(os.getpid(), sorted(gpus)))
            else:
                self._own.path.unlink(missing_ok=True)
        except OSError as exc:  # a full disk: another process's gateway then still sends to these GPUs
            oplog.caught("gateway", exc, "publishing the GPUs left out of the gateway", gpus=sorted(gpus))

    def others(self) -> set[int]:
        """The GPUs other live processes leave out now (cached for MAX_AGE_S)."""
        now = time.monotonic()
        with self._lock:
            at, gpus = self._seen
            if now - at < MAX_AGE_S:
                return set(gpus)
            found: set[int] = set()
            for path in self._dir.glob(f"{PREFIX}-*.json"):
                store = self._stores.get(path)
                if store is None:
                    store = self._stores[path] = JsonStore(path, LeftOut)
                note = store.read()
                if note is not None and note.pid != os.getpid() and pid_alive(note.pid):
                    found.update(note.gpus)
            self._seen = (now, found)
            return set(found)

    def close(self) -> None:
        self.publish(set())
