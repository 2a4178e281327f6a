"""An artifact's download state as an explicit state machine: typed events, one pure transition.

    queued ──Began──▶ downloading ◀──▶ verifying ◀──▶ extracting ──Completed──▶ done
      │                    │ (WaitingForParts / VerifyingPart / ExtractingParts move between these three)
      ├──FoundComplete─────┼──────────────────────────────────────────────────▶ done
      └───────────▶ paused (Paused, Interrupted) · cancelled (Cancelled) · failed (Failed)
    paused / cancelled / failed ──Began──▶ downloading (Resume)

Modelled on `app/backend/engine/decider/statemachine.py`: `transition()` is the ONLY place an artifact's
state changes (the progress board applies it; the job journals what it returns; the manager reads
journals through it), and an illegal move raises instead of showing a badge that lies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from app.backend.download.types import ArtifactState

A = ArtifactState
ACTIVE = frozenset({A.DOWNLOADING, A.VERIFYING, A.EXTRACTING})
RESUMABLE = frozenset({A.QUEUED, A.PAUSED, A.CANCELLED, A.FAILED})


class IllegalTransition(RuntimeError):
    pass


@dataclass(frozen=True)
class ArtifactStatus:
    state: ArtifactState = A.QUEUED
    reason: str = ""


@dataclass(frozen=True)
class Began:
    """A run takes the artifact on (first start or resume)."""

    reason: str = ""


@dataclass(frozen=True)
class WaitingForParts:
    """The extractor waits for bytes still on the wire."""


@dataclass(frozen=True)
class VerifyingPart:
    """The extractor waits for a part whose bytes are all in and are being hashed."""


@dataclass(frozen=True)
class ExtractingParts:
    """Every part the extractor needs next is verified."""


@dataclass(frozen=True)
class Completed:
    warning: str = ""


@dataclass(frozen=True)
class FoundComplete:
    """The journal says done and the tree is there: nothing to do."""


@dataclass(frozen=True)
class Paused:
    reason: str


@dataclass(frozen=True)
class Cancelled:
    reason: str = "cancelled; downloaded data is kept (Clean partial data removes it)"


@dataclass(frozen=True)
class Failed:
    reason: str


@dataclass(frozen=True)
class Interrupted:
    """A journal left in an active state by a process that ended without saying so (kill -9, reboot)."""

    reason: str = "interrupted (the process ended mid-run); Resume continues where it stopped"


Event = Union[Began, WaitingForParts, VerifyingPart, ExtractingParts, Completed, FoundComplete, Paused,
              Cancelled, Failed, Interrupted]

ALLOWED: dict[type, frozenset[ArtifactState]] = {
    Began: RESUMABLE | {A.DONE},  # DONE: the journal said done but the tree is gone -> fetched again
    WaitingForParts: ACTIVE,
    VerifyingPart: ACTIVE,
    ExtractingParts: ACTIVE,
    Completed: ACTIVE,
    FoundComplete: RESUMABLE | {A.DONE},
    Paused: ACTIVE | {A.QUEUED, A.PAUSED},
    Cancelled: ACTIVE | {A.QUEUED, A.PAUSED, A.CANCELLED},
    Failed: ACTIVE | RESUMABLE,
    Interrupted: ACTIVE,
}

_PHASE: dict[type, ArtifactState] = {WaitingForParts: A.DOWNLOADING, VerifyingPart: A.VERIFYING,
                                      ExtractingParts: A.EXTRACTING}


def transition(status: ArtifactStatus, event: Event) -> ArtifactStatus:
    """Apply one event. Raises IllegalTransition when the event is not allowed in this state."""
    if status.state not in ALLOWED[type(event)]:
        raise IllegalTransition(f"{type(event).__name__} is not allowed in state {status.state.value}")
    if isinstance(event, Began):
        return ArtifactStatus(A.DOWNLOADING, event.reason)
    if isinstance(event, (WaitingForParts, VerifyingPart, ExtractingParts)):
        return ArtifactStatus(_PHASE[type(event)], status.reason)
    if isinstance(event, Completed):
        return ArtifactStatus(A.DONE, event.warning)
    if isinstance(event, FoundComplete):
        return ArtifactStatus(A.DONE, "already complete")
    if isinstance(event, (Paused, Interrupted)):
        return ArtifactStatus(A.PAUSED, event.reason)
    if isinstance(event, Cancelled):
        return ArtifactStatus(A.CANCELLED, event.reason)
    if isinstance(event, Failed):
        return ArtifactStatus(A.FAILED, event.reason)
    raise IllegalTransition(f"unknown event {event!r}")


def restored(state: ArtifactState, reason: str) -> ArtifactStatus:
    """The status a journal stands for when no run is live: an active state means the run was killed."""
    status = ArtifactStatus(state, reason)
    return transition(status, Interrupted()) if state in ACTIVE else status
