"""ABRunService: generates every prompt × seed on A, switches the engine, then on B (one GPU:
sequential), journalling each answer; `resume(run_id)` continues a run after a panel restart.

On a box of several GPUs (docs/engine.md "Several GPUs") `engine_for` may put A and B on two GPUs' engines: then
both sides generate at once, each on its own engine, with no switch between A and B at all (an engine switches
only if it does not already serve its side's profile); `on_sides(True/False)` is told before and after, so the
caller (the box) leaves those GPUs out of the gateway while they measure. The panel's service knows every
GPU's engine (`engines`) and a run names its two GPUs (`start(..., gpus=(A, B))`, the Compare tab's "side by
side"); `on_gpus(True/False, gpus)` is then told instead.

A run that would leave no GPU of the box serving (A and B on every GPU) is refused unless it is asked for
(`every_gpu=True`, the Compare tab's tick-box): by default one GPU keeps serving (docs/selftest.md "Blind A/B",
issue 49). Whatever the run did, each engine it switched is switched back to the profile (and build) it served
before, when the run ends, is cancelled or fails, before its GPUs go back into the gateway.

The engine is switched only through the controller's public API (`switch`, `snapshot`, `wait_for`).
Answers are never truncated (the card's methodology note: clipping flipped a result): max_tokens is
the user's, and an answer that hits it is marked `length` so the grader can see it.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from collections.abc import Mapping
from typing import TYPE_CHECKING, Callable

from app.backend import oplog
from app.backend.contracts import EngineSnapshot
from app.backend.engine.builds import store as builds
from app.backend.abtest.journal import ABSpec, Generation, Journal, RunState, Side
from app.backend.selftest.probe import Cancelled, EngineProbe
from app.backend.jobs import BackgroundJob, JobState

if TYPE_CHECKING:  # types only: build_app_state hands the controller in
    from app.backend.engine.controller import EngineController
    from app.backend.config.settings import Settings

SWITCH_TIMEOUT_S = 3600.0


ALREADY_RUNNING = "an A/B run is already running: wait for it or cancel it"


def every_gpu_message(gpus: tuple[int, int]) -> str:
    on = f"GPU {gpus[0]}" if gpus[0] == gpus[1] else f"GPU {gpus[0]} and GPU {gpus[1]}"
    return (f"A and B on {on} leave no GPU of this box serving: the gateway refuses every request until the run "
            "ends. Put A and B on one GPU (they take turns) so the other keeps serving, or tick 'Take every GPU "
            "out of service' (CLI: --every-gpu) to go ahead.")


def serves(snap: EngineSnapshot, profile: str, build: str | None, current_build: str) -> bool:
    """Does an engine's snapshot serve `profile` on `build` (None: the current build) now?"""
    same_build = snap.build == (build or current_build) or (build is None and not snap.build)  # "": before builds
    return snap.is_ready and snap.profile_id == profile and same_build


@dataclass(frozen=True)
class ABProgress:
    state: JobState = JobState.IDLE
    run_id: str = ""
    done: int = 0
    total: int = 0
    eta_s: float | None = None
    step: str = ""
    message: str = ""


def split_side(side: str) -> tuple[str, str | None]:
    """`quality@next` -> ("quality", "next"); `quality` -> ("quality", None): an A/B side is a profile on a build."""
    profile, sep, build = side.partition("@")
    return profile, (build or None) if sep else None


class ABRunService(BackgroundJob[ABProgress]):
    def __init__(self, settings: Settings, engine: EngineController, probe_factory: Callable[[str], EngineProbe] | None = None,
                 *, engine_for: Callable[[Side], EngineController] | None = None,
                 on_sides: Callable[[bool], None] | None = None,
                 engines: Mapping[int, EngineController] | None = None,
                 on_gpus: Callable[[bool, tuple[int, ...]], None] | None = None):
        self.settings = settings
        self.engine = engine
        self._engine_for = engine_for or (lambda side: engine)
        self._on_sides = on_sides
        self._engines = dict(engines or {})
        self._on_gpus = on_gpus
        self._journal_lock = threading.Lock()  # two sides at once append to one journal
        self.journal = Journal(settings.ensure_state_dir())
        self._probe_factory = probe_factory or (lambda url: EngineProbe(url, settings.recipe.model.served_name,
                                                                        settings.recipe.sampling))
        super().__init__(ABProgress(), "abtest")

    @property
    def gpus(self) -> list[int]:
        """The GPUs a run may put its sides on (a box of several); [] on a one-GPU box."""
        return sorted(self._engines)

    def takes_every_gpu(self, gpus: tuple[int, int] | None) -> bool:
        """Would a run on `gpus` leave no GPU of this box serving?"""
        return gpus is not None and bool(self._engines) and set(self._engines) <= set(gpus)

    def _sides_on(self, gpus: tuple[int, int] | None, every_gpu: bool = False
                  ) -> tuple[Callable[[Side], EngineController], Callable[[bool], None] | None]:
        """(each side's engine, what to tell before and after both sides run at once) for a run on `gpus` (A's GPU,
        B's GPU); None: the service's own. Raises ValueError for GPUs that are not two of this box's, and for a
        run on every GPU of the box unless `every_gpu` (see the module docstring)."""
        if gpus is None:
            return self._engine_for, self._on_sides
        a, b = gpus
        if a not in self._engines or b not in self._engines:
            have = ", ".join(map(str, self.gpus)) or "one GPU"
            raise ValueError(f"GPUs {a} and {b}: name GPUs of this box for A and B (it has {have})")
        if self.takes_every_gpu(gpus) and not every_gpu:
            raise ValueError(every_gpu_message(gpus))
        ea, eb = self._engines[a], self._engines[b]  # the same GPU twice: A then B on it, switching between
        told = self._on_gpus
        return (lambda side: ea if side == "A" else eb), (
            (lambda on: told(on, tuple(sorted({a, b})))) if told is not None else None)

    def start(self, spec: ABSpec, who: str = oplog.PAGE, gpus: tuple[int, int] | None = None,
              every_gpu: bool = False) -> ABProgress:
        """Journal a new run and generate it; `gpus` (A's GPU, B's GPU): on a box of several, both sides at once
        on two GPUs' engines, with no switch between them (the other GPUs keep serving); `every_gpu`: the user
        agreed to a run that leaves no GPU serving."""
        self._sides_on(gpus, every_gpu)  # refuse bad GPUs before anything is journalled
        known = {p.id for p in self.engine.profiles()}
        reg = builds.registry(self.settings)
        for side in (spec.profile_a, spec.profile_b):
            pid, build = split_side(side)
            if pid not in known:
                raise ValueError(f"unknown profile {pid!r} (known: {', '.join(sorted(known))})")
            if build:
                try:
                    reg.get(build)
                except builds.UnknownBuild as exc:
                    raise ValueError(exc.args[0]) from None
        if self.running():
            raise ValueError(ALREADY_RUNNING)
        self.journal.create(spec)
        return self.resume(spec.run_id, who=who, gpus=gpus, every_gpu=every_gpu)

    def resume(self, run_id: str, who: str = oplog.PAGE, gpus: tuple[int, int] | None = None,
               every_gpu: bool = False) -> ABProgress:
        """Start or resume `run_id` in the background; `who`: who asked (the operator's log has start and end);
        `gpus`, `every_gpu`: as for `start`."""
        if self.running():
            raise ValueError(ALREADY_RUNNING)
        pick, told = self._sides_on(gpus, every_gpu)
        st = self.journal.load(run_id)
        first = ABProgress(JobState.RUNNING, run_id, st.generated, st.total, step="starting", message="running")
        if not self._launch(first, lambda: self._run(st, who, pick, told)):
            raise ValueError(ALREADY_RUNNING)
        oplog.decision("abtest", "start", who=who, run=run_id, a=st.spec.profile_a, b=st.spec.profile_b,
                       done=st.generated, total=st.total, gpus=f"{gpus[0]},{gpus[1]}" if gpus else None)
        return self.progress()

    def _side(self, st: RunState, side: Side, profile: str, t0: float, made: list[int],
              engine: EngineController) -> None:
        """Generate every missing answer of one side on that side's engine."""
        todo = st.missing(side)
        if not todo:
            return
        self._ensure_profile(profile, engine)
        probe = self._probe_factory(engine.snapshot().base_url)
        for pid, seed in todo:
            if self._stop.is_set():
                raise Cancelled()
            self._set(replace(self.progress(), step=f"{side} = {profile}: {pid} seed {seed}"))
            g = self._generate(probe, st, side, pid, seed)
            with self._journal_lock:
                self.journal.append(st.spec.run_id, g)
                st.gens[(g.side, pid, seed)] = g
                made[0] += 1
                per = (time.monotonic() - t0) / made[0]
                self._set(replace(self.progress(), done=st.generated, eta_s=per * (st.total - st.generated)))

    def _both_sides(self, st: RunState, t0: float, made: list[int], pick: Callable[[Side], EngineController]) -> None:
        """A and B on two engines at once (see the module docstring); the first failure is raised here."""
        errors: list[BaseException] = []

        def run(side: Side, profile: str) -> None:
            try:
                self._side(st, side, profile, t0, made, pick(side))
            except BaseException as exc:  # re-raised on the job thread below
                errors.append(exc)
                self._stop.set()  # the other side stops too: the journal keeps what was done

        threads = [threading.Thread(target=run, args=(side, profile), name=f"abtest-{side}", daemon=True)
                   for side, profile in (("A", st.spec.profile_a), ("B", st.spec.profile_b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise next((e for e in errors if not isinstance(e, Cancelled)), errors[0])

    def _run(self, st: RunState, who: str, pick: Callable[[Side], EngineController],
             told: Callable[[bool], None] | None) -> None:
        t0, made_box = time.monotonic(), [0]
        before = self._served(pick)
        if told is not None:  # the GPUs measured are left out of the gateway meanwhile
            told(True)
        try:
            try:
                if pick("A") is not pick("B"):
                    self._both_sides(st, t0, made_box, pick)
                else:
                    sides: tuple[tuple[Side, str], ...] = (("A", st.spec.profile_a), ("B", st.spec.profile_b))
                    for side, profile in sides:
                        self._side(st, side, profile, t0, made_box, pick(side))
            finally:  # each engine back on what it served, then back in the gateway, before the run is over
                try:
                    self._restore(before, who, st.spec.run_id)
                finally:
                    if told is not None:
                        told(False)
            made = made_box[0]
            self._set(replace(self.progress(), state=JobState.DONE, step="done", eta_s=0.0,
                              message="all answers generated: grade them blind"))
            oplog.decision("abtest", "end", who=who, run=st.spec.run_id, result="done", made=made)
            self._evidence(st)
        except Cancelled:
            made = made_box[0]
            self._set(replace(self.progress(), state=JobState.CANCELLED,
                              message="cancelled: finished answers are kept; resume to continue"))
            oplog.decision("abtest", "end", who=who, run=st.spec.run_id, result="cancelled", made=made)
        except Exception as exc:  # engine gone, switch failed: the journal keeps what was done
            made = made_box[0]
            step = self.progress().step
            self._set(replace(self.progress(), state=JobState.FAILED,
                              message=f"stopped at {step}: {exc} — resume to continue"))
            oplog.caught("abtest", exc, f"generating the A/B answers (at {step})", who=who, run=st.spec.run_id,
                         result="failed", made=made)

    def _evidence(self, st: RunState) -> None:
        """Each side's build gets this run as evidence (`moet-panel engine builds`)."""
        reg = builds.registry(self.settings)
        for side, other in ((st.spec.profile_a, st.spec.profile_b), (st.spec.profile_b, st.spec.profile_a)):
            build = split_side(side)[1] or reg.current_id()
            try:
                reg.add_evidence(build, builds.Evidence("abtest", st.spec.run_id, time.time(), f"{side} vs {other}"))
            except OSError as exc:
                oplog.caught("abtest", exc, "recording the A/B as evidence of its builds", run=st.spec.run_id)

    def _gpu_of(self, engine: EngineController) -> int | None:
        return next((g for g, e in self._engines.items() if e is engine), None)

    def _served(self, pick: Callable[[Side], EngineController]) -> list[tuple[EngineController, str]]:
        """(engine, the side string it serves now) for each engine of this run that serves a profile."""
        out: list[tuple[EngineController, str]] = []
        current = builds.registry(self.settings).current_id()
        for engine in dict.fromkeys((pick("A"), pick("B"))):  # one entry per engine, in order
            snap = engine.snapshot()
            if snap.is_ready and snap.profile_id:
                build = snap.build if snap.build and snap.build != current else None
                out.append((engine, f"{snap.profile_id}@{build}" if build else snap.profile_id))
        return out

    def _restore(self, before: list[tuple[EngineController, str]], who: str, run_id: str) -> None:
        """Switch each engine back to what it served before the run; not cancellable (the box must serve what it
        served); a failure is logged and the next engine is still restored."""
        current = builds.registry(self.settings).current_id()
        for engine, side in before:
            profile, build = split_side(side)
            if serves(engine.snapshot(), profile, build, current):
                continue
            gpu = self._gpu_of(engine)
            self._set(replace(self.progress(), step=f"switching back to {side}"
                              + (f" on GPU {gpu}" if gpu is not None else "")))
            try:
                ticket = engine.switch(profile, build=build, who=who)
                if not ticket.accepted:
                    raise RuntimeError(ticket.message)
                ticket.wait(SWITCH_TIMEOUT_S)
                snap = engine.wait_for(lambda s: s.is_ready or s.state.value == "failed", SWITCH_TIMEOUT_S)
                if not (snap.is_ready and snap.profile_id == profile):
                    raise RuntimeError(f"{snap.state.value}: {snap.message}")
            except Exception as exc:  # the run's outcome stands; the operator sees what was left
                oplog.caught("abtest", exc, f"switching back to {side} after the A/B", who=who, run=run_id, gpu=gpu)
                continue
            oplog.decision("abtest", "switched back", who=who, run=run_id, profile=side, gpu=gpu)

    def _ensure_profile(self, side: str, engine: EngineController | None = None) -> None:
        """Serve a side: `PROFILE` (the current build) or `PROFILE@BUILD` (docs/engine.md "Upgrading the engine"),
        on `engine` (a side's own GPU when A and B run side by side) or the panel's."""
        engine = engine or self.engine
        profile, build = split_side(side)
        if serves(engine.snapshot(), profile, build, builds.registry(self.settings).current_id()):
            return
        self._set(replace(self.progress(), step=f"switching the engine to {side}"))
        ticket = engine.switch(profile, build=build)
        if not ticket.accepted:
            raise RuntimeError(ticket.message)
        while not ticket.wait(0.5):
            if self._stop.is_set():
                raise Cancelled()
        snap = engine.wait_for(lambda s: s.is_ready or s.state.value == "failed", SWITCH_TIMEOUT_S)
        if not (snap.is_ready and snap.profile_id == profile):
            raise RuntimeError(f"the switch to {side} did not reach ready ({snap.state.value}: {snap.message})")

    def _generate(self, probe: EngineProbe, st: RunState, side: Side, pid: str, seed: int) -> Generation:
        prompt = next(p for p in st.spec.prompts if p.id == pid)
        t0 = time.monotonic()
        t = probe.generate(prompt.messages(), st.spec.max_tokens, seed=seed, cancel=self._stop)
        return Generation(side, pid, seed, t.text, t.completion_tokens,
                          round(t.decode_tok_s, 3) if t.decode_tok_s else None, round(time.monotonic() - t0, 3),
                          t.finish_reason)
