"""A drain made by another process, seen by the panel (docs/engine.md "Keeps serving").

A stop or switch from the CLI (or a second panel) drains the panel's answers too (answers.py), but the panel's
gateway and Chat tab follow the panel's own snapshot: without this note they would go on starting answers on
the engine the other process is about to stop, and those answers would be cut at the grace's end. So the process
that drains writes `<engine state dir>/draining.json` (its pid, how many answers it waits for, until when, when
the engine is expected back) at the drain's start and on each change, and `draining: false` once the drained engine
has stopped (not at the drain's end: in between, another process's gateway would start answers to be cut); the
panel's observer reads it on each pass and mirrors it into its own snapshot (`draining`), so its gateway refuses
new requests with 503 and a Retry-After, exactly as during its own drain. A note whose writer is gone (its pid
dead) or whose deadline passed counts as no drain.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from app.backend.files.atomic import pid_alive
from app.backend.files.jsonstore import JsonStore

FILE = "draining.json"
LATE_S = 5.0  # a note past its deadline by this much is stale (its writer stopped without saying so)


@dataclass(frozen=True)
class DrainNote:
    pid: int
    draining: bool
    in_flight: int = 0
    deadline: float = 0.0
    expected_back_s: float = 0.0


class DrainNotes:
    """This engine's drain note: written by the draining process, read by the others."""

    def __init__(self, state_dir: Path) -> None:
        self._store = JsonStore(Path(state_dir) / FILE, DrainNote)

    def publish(self, draining: bool, in_flight: int = 0, deadline: float = 0.0, expected_back_s: float = 0.0) -> None:
        """Say this process's drain (OSError: a full disk; the caller logs it, the drain goes on)."""
        self._store.write(DrainNote(os.getpid(), draining, in_flight, deadline, expected_back_s))

    def end_own(self) -> None:
        """The drained engine stopped: this process's note, if it still says draining, says it no longer does. The
        note stays up from the drain's start to the engine's stop, not only to the drain's end: the engine is stopped
        right after the drain, and another process's gateway that saw the drain end first would send that engine a
        new answer to be cut (OSError: the caller logs it)."""
        note = self._store.read()
        if note is not None and note.pid == os.getpid() and note.draining:
            self.publish(False)

    def other(self) -> DrainNote | None:
        """Another live process's drain going on now, else None."""
        note = self._store.read()
        if note is None or not note.draining or note.pid == os.getpid() or not pid_alive(note.pid):
            return None
        if note.deadline and time.time() > note.deadline + LATE_S:
            return None
        return note
