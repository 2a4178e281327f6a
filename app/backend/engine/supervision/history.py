"""The supervisor's memory on disk, beside the desired state (docs/engine.md, "Keeps serving").

`<state_dir>/engine-supervision.json` keeps the restart history (the 3-in-15-min cap and `restarts_total`)
and the failure record of a give-up. Every process on the data dir reads the same file, so a CLI's
`engine status --json` and the panel's /metrics agree on restarts_total, and a panel restart does not reset
the cap. "Gave up" is derived, never stored as a flag of its own: the failure record names the wish it gave up
on (`desired.since`), so any new wish — a CLI `engine start`, a second panel — clears it without this panel
seeing the click; READY clears the record itself.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from app.backend.engine.supervision.desired import Desired
from app.backend.engine.errlog import ENGINE_ERRORS
from app.backend.files.jsonstore import JsonStore

KEEP = 50  # restart times kept (the cap looks at a 15-minute window; the rest is for the log)


@dataclass(frozen=True)
class GiveUpRecord:
    desired_since: float  # the wish given up on (Desired.since): a newer wish clears it
    reason: str
    why: str


@dataclass(frozen=True)
class Supervision:
    restarts_total: int = 0
    restarts_at: tuple[float, ...] = ()
    gave_up: GiveUpRecord | None = None
    boot_s: tuple[tuple[str, float], ...] = ()  # the last boot's seconds per profile (the drain's Retry-After)
    # switches by result (ok, failed, rolled_back, cancelled), by every process on the data dir: the CLI's
    # `engine status --json` and the Service tab count the same switches (issue 49: 0 in one, 3 in the other)
    switches: tuple[tuple[str, int], ...] = ()

    def switch_count(self, result: str) -> int:
        return next((n for k, n in self.switches if k == result), 0)

    def boot_seconds(self, profile_id: str | None) -> float | None:
        return next((v for k, v in self.boot_s if k == profile_id), None)

    def recent(self, desired: Desired | None) -> list[float]:
        """Restarts made for this wish: a person's new wish starts the cap from zero."""
        since = desired.since if desired is not None else 0.0
        return [t for t in self.restarts_at if t >= since]

    def gave_up_on(self, desired: Desired | None) -> GiveUpRecord | None:
        """The give-up that still holds: the same wish to serve, not met since."""
        g = self.gave_up
        if g is None or desired is None or desired.kind != "serve" or g.desired_since != desired.since:
            return None
        return g


class SupervisionStore:
    def __init__(self, state_dir: Path) -> None:
        self._store = JsonStore(Path(state_dir) / "engine-supervision.json", Supervision)
        self.path = self._store.path

    def read(self) -> Supervision:
        # never written, or unreadable: no history (a restart is allowed)
        return self._store.read() or Supervision()

    def _write(self, s: Supervision) -> Supervision:
        try:
            self._store.write(replace(s, restarts_at=s.restarts_at[-KEEP:]))
        except OSError as exc:  # an unwritable data dir: the supervisor still acts; preflight reports the dir
            ENGINE_ERRORS.caught(f"recording the restart history in {self.path}", exc)
        return s

    def restarted(self, at: float, *, capped: bool = True) -> Supervision:
        """One restart made; `capped`: it counts against the cap (an ENVIRONMENT cause's retry does not)."""
        s = self.read()
        return self._write(replace(s, restarts_total=s.restarts_total + 1,
                                   restarts_at=(*s.restarts_at, at) if capped else s.restarts_at))

    def give_up(self, desired: Desired, reason: str, why: str) -> Supervision:
        return self._write(replace(self.read(), gave_up=GiveUpRecord(desired.since, reason, why)))

    def clear_failure(self) -> Supervision:
        s = self.read()
        return s if s.gave_up is None else self._write(replace(s, gave_up=None))

    def switched(self, result: str) -> Supervision:
        """One switch ended with `result` (ok, failed, rolled_back, cancelled)."""
        s = self.read()
        n = s.switch_count(result) + 1
        return self._write(replace(s, switches=(*((k, v) for k, v in s.switches if k != result), (result, n))))

    def booted(self, profile_id: str, seconds: float) -> Supervision:
        s = self.read()
        return self._write(replace(s, boot_s=(*((k, v) for k, v in s.boot_s if k != profile_id),
                                              (profile_id, round(seconds, 1)))))
