"""Promote a build or roll back, on evidence (docs/engine.md "Upgrading the engine").

Promote makes a build current (the local pin override, engine/builds/store.py: the recipe file is not edited),
records the evidence it was promoted on and who promoted it in the operator's log, and — when an engine
serves — switches it to the new current build with the drain (the controller's switch drains).
Roll back returns to the build current before the last promotion, the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.backend import oplog
from app.backend.engine.builds import store as builds
from app.backend.engine.controller import EngineController
from app.backend.engine.lifecycle.tickets import Ticket


@dataclass(frozen=True)
class Outcome:
    current: str  # the build current now
    previous: str
    ticket: Ticket | None  # the switch to it, when an engine served


def _switch_to(ctl: EngineController, build_id: str, who: str) -> Ticket | None:
    snap = ctl.snapshot()
    if not snap.is_ready or not snap.profile_id or snap.build == build_id:
        return None  # nothing serves (the next start runs the current build), or it already serves
    return ctl.switch(snap.profile_id, who=who, build=build_id)


def promote(ctl: EngineController, build_id: str, who: str) -> Outcome:
    """ValueError (unknown build, already current) or OSError (state dir) leaves everything as it was."""
    reg = builds.registry(ctl.settings)
    try:
        p = reg.promote(build_id, who)
    except builds.UnknownBuild as exc:
        raise ValueError(exc.args[0]) from None
    b = reg.get(build_id)
    oplog.decision("engine", "promote", who=who, build=b.id, commit=b.commit, image=b.image, previous=p.previous,
                   evidence=",".join(f"{e.kind}:{e.ref}" for e in p.evidence) or "none")
    return Outcome(b.id, p.previous, _switch_to(ctl, b.id, who))


def rollback(ctl: EngineController, who: str) -> Outcome:
    reg = builds.registry(ctl.settings)
    undone = reg.rollback(who)
    now = reg.current_id()
    oplog.decision("engine", "rollback", who=who, build=now, undone=undone.build)
    return Outcome(now, undone.build, _switch_to(ctl, now, who))
