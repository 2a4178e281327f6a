"""Engine builds the panel holds, and which one serves by default (docs/engine.md "Upgrading the engine").

A build is an engine image made from one commit of the engine source (`moet-panel engine build-image
--commit REF`). The recipe's pin (its `engine.commit` / `engine.image`) is the build `pin`, always listed.
Which build serves by default ("current") is the recipe's pin until a promotion: a local pin override
beside the recipe in the state dir (`engine-pin-<recipe>.json`) records the promoted build, the evidence it
was promoted on and who promoted it; the recipe file itself is never edited. Roll back pops that history.

Every RunSpec's image is chosen here (`BuildRegistry.image_for`), by the one caller that builds the spec
(the controller's `run_spec`, `moet-panel command`).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.backend import oplog
from app.backend.files.jsonstore import JsonStore
from app.backend.config.settings import Settings

PIN_ID = "pin"
BUILDS_FILE = "engine-builds.json"
ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")


class UnknownBuild(KeyError):
    """No build of that id for this recipe; the message lists the known ones."""


@dataclass(frozen=True)
class Evidence:
    """One run that used a build: a self-test or one side of an A/B."""

    kind: str  # "selftest" | "abtest"
    ref: str  # the run's id (its report file stem)
    at: float
    summary: str = ""


@dataclass(frozen=True)
class Build:
    id: str
    commit: str
    image: str
    recipe: str
    built_at: float = 0.0
    size_bytes: int | None = None
    source: str = ""  # where it was built from: "recipe pin", a checkout, "SIMULATED demo variant"
    simulated: bool = False
    variant: str = ""  # a SIMULATED build's variant ("next"), passed to its engine as MOET_SIM_BUILD
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class Promotion:
    build: str
    previous: str  # the build that was current before
    at: float
    who: str
    evidence: tuple[Evidence, ...] = ()


@dataclass(frozen=True)
class BuildsFile:
    builds: tuple[Build, ...] = ()


@dataclass(frozen=True)
class PinOverride:
    """The local pin override beside the recipe: promotions in order; the last one's build is current."""

    recipe: str
    promotions: tuple[Promotion, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class BuildView:
    build: Build
    current: bool


class BuildRegistry:
    """Read/write the builds and the pin override of one recipe. Writes are whole-file and atomic (JsonStore);
    the lock serialises this process's read-modify-write (the CLI and the panel seldom write at once)."""

    def __init__(self, state_dir: Path, recipe_id: str, pin_commit: str, pin_image: str, simulated: bool = False) -> None:
        self.state_dir = Path(state_dir)
        self.recipe_id = recipe_id
        self.pin = Build(PIN_ID, pin_commit, pin_image, recipe_id, source="recipe pin", simulated=simulated)
        self._builds = JsonStore(self.state_dir / BUILDS_FILE, BuildsFile)
        self._override = JsonStore(self.state_dir / f"engine-pin-{recipe_id}.json", PinOverride)
        self._lock = threading.Lock()

    @property
    def override_path(self) -> Path:
        return self._override.path

    # -- reading ---------------------------------------------------------------------------
    def _stored(self) -> tuple[Build, ...]:
        f = self._builds.read() or BuildsFile()
        return tuple(b for b in f.builds if b.recipe == self.recipe_id)

    def promotions(self) -> tuple[Promotion, ...]:
        o = self._override.read()
        return o.promotions if o is not None and o.recipe == self.recipe_id else ()

    def current_id(self) -> str:
        p = self.promotions()
        known = {b.id for b in self._stored()}
        return p[-1].build if p and p[-1].build in known else PIN_ID

    def all(self) -> list[Build]:
        stored = self._stored()
        pin_ev = next((b.evidence for b in stored if b.id == PIN_ID), ())
        return [replace(self.pin, evidence=pin_ev)] + [b for b in stored if b.id != PIN_ID]

    def views(self) -> list[BuildView]:
        cur = self.current_id()
        return [BuildView(b, b.id == cur) for b in self.all()]

    def get(self, build_id: str) -> Build:
        for b in self.all():
            if b.id == build_id:
                return b
        known = ", ".join(b.id for b in self.all())
        raise UnknownBuild(f"unknown build {build_id!r} (known: {known}; `moet-panel engine builds` lists them)")

    def current(self) -> Build:
        return self.get(self.current_id())

    def resolve(self, build_id: str | None) -> Build:
        """The build a start runs: the one named, else the current one. UnknownBuild for a wrong id."""
        return self.get(build_id) if build_id else self.current()

    def image_for(self, build_id: str | None) -> str:
        return self.resolve(build_id).image

    def build_of_image(self, image: str) -> Build | None:
        """The build an engine container's image belongs to (the current one first when two share it)."""
        cur = self.current_id()
        hits = [b for b in self.all() if b.image == image]
        return next((b for b in hits if b.id == cur), hits[0] if hits else None)

    # -- writing ---------------------------------------------------------------------------
    def add(self, build: Build) -> None:
        if not ID_RE.match(build.id) or build.id == PIN_ID:
            raise ValueError(f"build id {build.id!r}: letters, digits, . _ - (not {PIN_ID!r})")
        with self._lock:
            f = self._builds.read() or BuildsFile()
            keep = tuple(b for b in f.builds if not (b.recipe == self.recipe_id and b.id == build.id))
            old = next((b for b in f.builds if b.recipe == self.recipe_id and b.id == build.id), None)
            if old is not None:  # a rebuild of the same id keeps the evidence of the runs that used it
                build = replace(build, evidence=old.evidence)
            self._builds.write(BuildsFile(keep + (build,)))

    def add_evidence(self, build_id: str, ev: Evidence) -> None:
        """Record a run that used `build_id` (the pin too). Unknown ids are ignored (a deleted build)."""
        with self._lock:
            f = self._builds.read() or BuildsFile()
            builds = list(f.builds)
            for i, b in enumerate(builds):
                if b.recipe == self.recipe_id and b.id == build_id:
                    builds[i] = replace(b, evidence=b.evidence + (ev,))
                    break
            else:
                if build_id != PIN_ID:
                    return
                builds.append(replace(self.pin, evidence=(ev,)))
            self._builds.write(BuildsFile(tuple(builds)))

    def promote(self, build_id: str, who: str) -> Promotion:
        b = self.get(build_id)
        with self._lock:
            prev = self.current_id()
            if prev == b.id:
                raise ValueError(f"build {b.id} is already current")
            p = Promotion(b.id, prev, time.time(), who, b.evidence)
            self._override.write(PinOverride(self.recipe_id, self.promotions() + (p,)))
        return p

    def rollback(self, who: str) -> Promotion:
        """Undo the last promotion: the build current before it is current again. ValueError when none."""
        with self._lock:
            p = self.promotions()
            if not p:
                raise ValueError("nothing to roll back: the recipe's pin is current (no promotion recorded)")
            self._override.write(PinOverride(self.recipe_id, p[:-1]))
        return p[-1]


def image_tag(base_image: str, build_id: str) -> str:
    """`name:tag` of a build: the recipe image's name, tagged with the build id (`vllm-moet:de4af53`)."""
    name = base_image.rsplit(":", 1)[0] if ":" in base_image.rsplit("/", 1)[-1] else base_image
    return f"{name}:{build_id}"


def registry(settings: Settings) -> BuildRegistry:
    """The build registry of the settings' recipe and state dir."""
    eng = settings.recipe.engine
    return BuildRegistry(settings.state_dir, settings.recipe.id, eng.commit, eng.image, settings.recipe.simulated)


def record_boot(settings: Settings, build_id: str, profile_id: str, ok: bool, boot_s: float, diagnosis: str) -> None:
    """A boot of `build_id` is evidence too: its time when it came up, its diagnosis when it did not
    (the evidence page's "boot time" and "failures"). Never raises: the boot's outcome matters more."""
    ev = (Evidence("boot", profile_id, time.time(), f"{boot_s:.1f}") if ok
          else Evidence("failure", profile_id, time.time(), diagnosis or "boot failed"))
    try:
        registry(settings).add_evidence(build_id, ev)
    except OSError as exc:
        oplog.caught("engine", exc, "recording a boot as evidence of its build", build=build_id)


def side_choices(settings: Settings, profile_ids: list[str]) -> list[str]:
    """A/B sides the Compare tab offers: every profile, then every profile on each build that is not current
    (`quality@next`; the A/B switches the engine to that build for its side)."""
    reg = registry(settings)
    cur = reg.current_id()
    return profile_ids + [f"{p}@{b.id}" for b in reg.all() if b.id != cur for p in profile_ids]
