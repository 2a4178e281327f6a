"""SelfTestService: runs one self-test plan at a time as a cancellable background job.

States: idle -> running -> done | cancelled | failed (one writer: the job thread; readers get
immutable `SelfTestProgress` snapshots). The self-test never starts, stops or switches the engine:
it refuses unless the engine is READY on the profile asked for (docs/selftest.md).
"""

from __future__ import annotations

import datetime as dt
import statistics
import threading
import time
from dataclasses import dataclass, replace
from collections.abc import Mapping
from typing import TYPE_CHECKING, Callable

from app.backend.profiles.registry import ProfileRegistry
from app.backend import oplog
from app.backend.engine.builds import store as builds
from app.backend.contracts import GiB
from app.backend.jobs import BackgroundJob, JobState
from app.backend.recipe.command import config_hash
from app.backend.recipe.effective import EffectiveCommand
from app.backend.selftest.needle import DEPTHS, build_needle
from app.backend.selftest.pcie import read_links
from app.backend.selftest.probe import Cancelled, EngineProbe
from app.backend.selftest.report import Standing, standing_of
from app.backend.selftest.store import ResultsStore
from app.backend.selftest.types import (
    DecodeRun, NeedleOutcome, SelfTestPlan, SelfTestResult, TelemetrySummary, TtftPoint,
)

if TYPE_CHECKING:  # types only: the controller and the hub are handed in by build_app_state
    from app.backend.engine.controller import EngineController
    from app.backend.config.settings import Settings
    from app.backend.telemetry.sampler import TelemetryFrame

ASSUMED_PREFILL_TOK_S = 6000.0  # for the estimate only, before a TTFT point is measured
DECODE_PROMPT = [{"role": "user", "content": "Write a long, detailed explanation of how a lock-free multi-producer "
                                             "multi-consumer queue works, with code."}]


@dataclass(frozen=True)
class SelfTestProgress:
    state: JobState = JobState.IDLE
    profile_id: str = ""
    step: str = ""
    fraction: float = 0.0
    estimate_s: float = 0.0
    elapsed_s: float = 0.0
    message: str = ""
    result: SelfTestResult | None = None


@dataclass(frozen=True)
class Step:
    kind: str  # decode | ttft | needle
    label: str
    n: int  # decode: the run's index (its seed); ttft, needle: the prompt length in tokens
    expect_s: float
    depth: float = 0.0  # needle: where the needle sits (0..1)


def max_model_len(cmd: EffectiveCommand, default: int) -> int:
    """The command's --max-model-len in tokens ('256k' form read too), else `default`."""
    raw = (cmd.arg_value("--max-model-len") or "").lower()
    if raw:
        mult = {"k": 1024, "m": 1024 * 1024}.get(raw[-1:], 1)
        return int(float(raw[:-1] if mult > 1 else raw) * mult)
    return default


def plan_steps(plan: SelfTestPlan, decode_tok_s: float, ctx: int) -> list[Step]:
    """The steps of a plan with their expected seconds (the estimate shown before it starts)."""
    steps = [Step("decode", f"decode run {i + 1}/{plan.runs}", i, plan.decode_tokens / decode_tok_s + 1)
             for i in range(plan.runs)]
    steps += [Step("ttft", f"TTFT at {n} tokens", n, n / ASSUMED_PREFILL_TOK_S + 0.5)
              for n in plan.ttft_lengths if n < ctx]
    for n in plan.needle_lengths:
        for d in DEPTHS:
            steps.append(Step("needle", f"needle {n // 1024}K @ {d:g}", n,
                              n / ASSUMED_PREFILL_TOK_S + plan.needle_answer_tokens / decode_tok_s + 1, d))
    return steps


class SelfTestService(BackgroundJob["SelfTestProgress"]):
    """Owned by AppState; `engine` is the EngineController (public methods only), `frame_fn` the
    telemetry hub's latest frame (or None)."""

    def __init__(self, settings: Settings, engine: EngineController, frame_fn: Callable[[], TelemetryFrame | None] | None = None,
                 probe_factory: Callable[[str], EngineProbe] | None = None,
                 on_run: Callable[[bool, int | None], None] | None = None, gpu: int | None = None,
                 engines: Mapping[int, EngineController] | None = None):
        """`on_run(True/False, gpu)` is told before and after a run: on a box of several GPUs the box leaves
        the measured GPU out of the gateway meanwhile, so it measures undisturbed while the others serve
        (docs/engine.md "Several GPUs"). `engines`: every GPU's engine on such a box (a run may name its GPU);
        `engine` and `gpu` are the one measured when a run names none."""
        self.settings = settings
        self.profiles = ProfileRegistry(settings)  # recipe + custom, re-read when the folder changes
        self.engine = engine
        self._on_run = on_run
        self._gpu = gpu  # the GPU of this engine on a box of several: each result names it
        self._engines = dict(engines or {})
        self.frame_fn = frame_fn or (lambda: None)
        self.store = ResultsStore(settings.ensure_state_dir())
        self._probe_factory = probe_factory or self._default_probe
        super().__init__(SelfTestProgress(), "selftest")

    # --- public API -----------------------------------------------------------------------------------

    @property
    def gpus(self) -> list[int]:
        """The GPUs a run may name (a box of several); [] on a one-GPU box."""
        return sorted(self._engines)

    def engine_of(self, gpu: int | None) -> EngineController:
        """The engine a run on `gpu` measures (None: the default one). Raises KeyError for a GPU not on the box."""
        if gpu is None or (not self._engines and gpu == self._gpu):
            return self.engine
        return self._engines[gpu]

    def identity(self, profile_id: str, gpu: int | None = None) -> tuple[str, str]:
        """(engine image id, recipe hash) of a profile now: the store's key besides profile and date.

        The image id is the content id the profile's image name resolves to (an image rebuilt under the
        same tag is a new engine), else the name when the runtime cannot say (no Docker, the SIMULATED
        process runtime)."""
        try:
            engine = self.engine_of(gpu)  # the GPU's own run spec (its `--gpus device=N`): what it measured
            spec = engine.run_spec(profile_id, build=engine.snapshot().build or None)
            recipe_hash, image = config_hash(spec), spec.image
        except (KeyError, ValueError):
            return "", ""
        try:
            rt = engine.runtime
            resolved = rt.image_id(image) if rt is not None else ""
        except Exception as exc:  # Docker unreachable: the name is a fine fallback key
            oplog.caught("selftest", exc, "resolving the engine image's id (the name is used instead)")
            resolved = ""
        return resolved or image, recipe_hash

    def rerun_plan(self, profile_id: str) -> SelfTestPlan:
        """The plan of this profile's latest result (to measure the same again), else the default plan."""
        r = self.store.latest(profile_id)
        try:
            return SelfTestPlan.from_dict(profile_id, r.plan) if r is not None else SelfTestPlan(profile_id)
        except (ValueError, TypeError):  # a result written by an older, different plan: start afresh
            return SelfTestPlan(profile_id)

    def standing(self, profile_id: str) -> Standing | None:
        """This box's latest result of a profile beside the card, and whether it still applies (None: never run)."""
        r = self.store.latest(profile_id)
        if r is None:
            return None
        gpu = r.gpu if r.gpu is not None and r.gpu in self._engines else None  # the engine it measured
        return standing_of(r, *self.identity(profile_id, gpu))

    def estimate_s(self, plan: SelfTestPlan) -> float:
        return sum(s.expect_s for s in plan_steps(plan, self._card_rate(plan.profile_id) or 50.0,
                                                  self._ctx(plan.profile_id)))

    def check(self, profile_id: str, build: str | None = None, gpu: int | None = None) -> str:
        """'' when a self-test of this profile (on `build`, when named; on `gpu`'s engine, when named) can run now,
        else what to do first."""
        try:
            engine = self.engine_of(gpu)
        except KeyError:
            return f"GPU {gpu} is not one of this box's ({', '.join(map(str, self.gpus)) or 'one GPU'})"
        on = f" on GPU {gpu}" if gpu is not None and self._engines else ""
        snap = engine.snapshot()
        if build and snap.is_ready and snap.build != build:
            return (f"the engine serves build {snap.build or '?'}, not {build}: `moet-panel engine switch --profile "
                    f"{profile_id} --build {build}` first (the self-test never switches the engine)")
        if not snap.is_ready:
            return (f"the engine{on} is {snap.state.value}: start profile {profile_id} first (the self-test never "
                    "starts it)")
        if snap.profile_id != profile_id:
            return (f"the engine{on} serves profile {snap.profile_id}, not {profile_id}: switch to {profile_id} first "
                    "(the self-test never switches or restarts the engine)")
        if engine.busy() is not None:
            return "the engine is busy with a start/stop/switch: wait for it"
        return ""

    def start(self, plan: SelfTestPlan, who: str = oplog.PAGE, gpu: int | None = None) -> SelfTestProgress:
        """Start in the background; a refusal comes back as a FAILED progress with the reason. `who`: who asked
        (the operator's log has the start and the end). `gpu`: on a box of several, the GPU whose engine to
        measure (default: the service's); the others keep serving."""
        busy = replace(self.progress(), message="a self-test is already running: wait or cancel it")
        if self.running():
            return busy
        if why := self.check(plan.profile_id, gpu=gpu):
            return SelfTestProgress(JobState.FAILED, plan.profile_id, message=f"refused: {why}")
        first = SelfTestProgress(JobState.RUNNING, plan.profile_id, "starting", 0.0, self.estimate_s(plan),
                                 message="running")
        measured = self._gpu if gpu is None else gpu
        if not self._launch(first, lambda: self._run(plan, who, measured)):
            return busy
        oplog.decision("selftest", "start", who=who, profile=plan.profile_id,
                       gpu=measured)
        return self.progress()

    def run_blocking(self, plan: SelfTestPlan, on_progress: Callable[[SelfTestProgress], None] | None = None,
                     poll_s: float = 0.5, gpu: int | None = None) -> SelfTestProgress:
        """For the CLI: start, report progress until finished (Ctrl-C cancels)."""
        p = self.start(plan, who=oplog.CLI, gpu=gpu)
        if p.state is not JobState.RUNNING:
            return p
        try:
            while (p := self.wait(poll_s)).state is JobState.RUNNING:
                if on_progress:
                    on_progress(p)
        except KeyboardInterrupt:
            self.cancel()
            p = self.wait(60)
        return p

    # --- the job --------------------------------------------------------------------------------------
    def _evidence(self, result: SelfTestResult, ref: str) -> None:
        """The self-test is evidence for the build that served it (`moet-panel engine builds`)."""
        if not result.build:
            return
        mean = [d.tok_s for d in result.decode if d.tok_s]
        summary = f"{result.profile_id}: decode {sum(mean) / len(mean):.1f} tok/s" if mean else result.profile_id
        try:
            builds.registry(self.settings).add_evidence(result.build, builds.Evidence("selftest", ref, time.time(), summary))
        except OSError as exc:
            oplog.caught("selftest", exc, "recording the self-test as evidence of its build", build=result.build)

    def _card_rate(self, profile_id: str) -> float | None:
        p = self.profiles.find(profile_id)
        return float(p.decode.value) if p is not None and p.decode is not None else None

    def _ctx(self, profile_id: str) -> int:
        try:
            return max_model_len(self.engine.run_spec(profile_id).command, 262144)
        except (KeyError, ValueError):
            return 262144

    def _default_probe(self, base_url: str) -> EngineProbe:
        r = self.settings.recipe
        return EngineProbe(base_url, r.model.served_name, r.sampling)

    def _run(self, plan: SelfTestPlan, who: str = oplog.PAGE, gpu: int | None = None) -> None:
        t0 = time.monotonic()
        engine = self.engine_of(gpu)
        card = self._card_rate(plan.profile_id)
        ctx = self._ctx(plan.profile_id)
        steps = plan_steps(plan, card or 50.0, ctx)
        total = sum(s.expect_s for s in steps) or 1.0
        image, rhash = self.identity(plan.profile_id, gpu)
        result = SelfTestResult(plan.profile_id, image, rhash, dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                                bool(self.settings.recipe.simulated), card, plan=plan.to_dict(), gpu=gpu)
        watch = _TelemetryWatch(self.frame_fn, gpu if self._engines else None, pool=gpu == self._gpu)
        watch.start()
        probe = self._probe_factory(engine.snapshot().base_url)
        done_s = 0.0
        if self._on_run is not None:
            self._on_run(True, gpu)
        try:
            for step in steps:
                if self._stop.is_set():
                    raise Cancelled()
                if (why := self.check(plan.profile_id, gpu=gpu)):
                    raise RuntimeError(f"stopped: {why}")
                self._set(replace(self.progress(), step=step.label, fraction=done_s / total,
                                  elapsed_s=time.monotonic() - t0))
                self._do(step, plan, probe, result, ctx)
                done_s += step.expect_s
            result.wall_s = time.monotonic() - t0
            result.telemetry = watch.stop()
            result.build = engine.snapshot().build
            saved = self.store.save(result)
            self._evidence(result, saved.stem)
            self._set(replace(self.progress(), state=JobState.DONE, step="done", fraction=1.0,
                              elapsed_s=result.wall_s, message="done", result=result))
            oplog.decision("selftest", "end", who=who, profile=plan.profile_id, result="done",
                           wall_s=round(result.wall_s, 1))
        except Cancelled:
            watch.stop()
            self._set(replace(self.progress(), state=JobState.CANCELLED, message="cancelled: nothing was saved"))
            oplog.decision("selftest", "end", who=who, profile=plan.profile_id, result="cancelled")
        except Exception as exc:  # the engine went away, a bad answer...: say so, keep the panel up
            watch.stop()
            at = self.progress().step
            self._set(replace(self.progress(), state=JobState.FAILED, message=f"failed at {at}: {exc}"))
            oplog.caught("selftest", exc, f"running the self-test (step {at})", who=who, profile=plan.profile_id,
                         result="failed")
        finally:
            if self._on_run is not None:
                self._on_run(False, gpu)

    def _do(self, step: Step, plan: SelfTestPlan, probe: EngineProbe, result: SelfTestResult, ctx: int) -> None:
        if step.kind == "decode":
            before = probe.generation_tokens_total()
            t = probe.generate(DECODE_PROMPT, plan.decode_tokens, min_tokens=plan.decode_tokens, ignore_eos=True,
                               seed=step.n, cancel=self._stop)
            after = probe.generation_tokens_total()
            # the engine's own count of the tokens over the client's first-to-last-token time: a cross-check of the
            # count (tokens, not chunks); a wall clock around the calls read 33 tok/s for 49 on a loaded box
            m = (after - before - 1) / t.decode_s if before is not None and after is not None and t.decode_s > 0 else None
            if t.decode_tok_s is None:
                raise RuntimeError(f"the decode run produced {t.completion_tokens} tokens: too few to time")
            result.decode.append(DecodeRun(round(t.decode_tok_s, 3), t.completion_tokens, round(t.ttft_s, 3),
                                           round(m, 3) if m is not None else None))
        elif step.kind == "ttft":
            msgs = [{"role": "user", "content": "word " * int(step.n / 1.3) + "\nSay hi."}]
            t = probe.generate(msgs, 1, thinking=False, cancel=self._stop)
            result.ttft.append(TtftPoint(t.prompt_tokens or probe.tokenize(msgs), round(t.ttft_s, 3)))
        else:
            length, depth = step.n, step.depth
            target = min(length, ctx - plan.needle_answer_tokens - 8)
            if length > ctx:
                result.needles.append(NeedleOutcome(length, depth, 0, "", False, "",
                                                    skipped=f"past this profile's --max-model-len {ctx}"))
                return
            np_ = build_needle(probe.tokenize, target, depth, salt=result.date)
            t = probe.generate(np_.messages, plan.needle_answer_tokens, thinking=False, cancel=self._stop)
            result.needles.append(NeedleOutcome(length, depth, np_.tokens, np_.code, np_.code in t.text, t.text[:200]))


class _TelemetryWatch:
    """Samples the telemetry hub's latest frame once a second while the self-test runs."""

    def __init__(self, frame_fn: Callable[[], TelemetryFrame | None], gpu: int | None = None, pool: bool = True):
        """`gpu`: on a box of several, the measured GPU (the other cards' figures are not this run's); `pool`: the
        hub's pool trace is this engine's (it follows one GPU's engine log)."""
        self._frame_fn = frame_fn
        self._gpu = gpu
        self._pool = pool
        self._stop = threading.Event()
        self._sum = TelemetrySummary()
        self._thread = threading.Thread(target=self._loop, name="selftest-telemetry", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> TelemetrySummary:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(5)
            links = read_links()
            if links:
                self._sum.pcie = "; ".join(x.text() for x in links)
                self._sum.pcie_below_max = any(x.below_max for x in links)
        return self._sum

    def _loop(self) -> None:
        churn: list[float] = []
        errors = oplog.Once("selftest")
        while True:
            try:
                self._take(self._frame_fn(), churn)
            except Exception as exc:  # telemetry is best-effort during a self-test: said once, not per second
                errors.caught(exc, "sampling telemetry during the self-test")
            if self._stop.wait(1.0):
                break
        if churn:
            self._sum.churn_per_s = round(statistics.median(churn), 1)

    def _take(self, f: TelemetryFrame | None, churn: list[float]) -> None:
        if f is None:
            return
        s = self._sum
        cards = [g for g in f.gpus if self._gpu is None or g.index == self._gpu]
        if cards:
            used, total = sum(g.memory_in_use for g in cards) / GiB, sum(g.memory_total for g in cards) / GiB
            s.vram_peak_gib = max(s.vram_peak_gib or 0.0, round(used, 2))
            s.vram_total_gib = round(total, 2)
            clocks = [g.sm_clock_mhz for g in cards if g.sm_clock_mhz]
            if clocks:
                s.sm_clock_min_mhz = min([s.sm_clock_min_mhz or clocks[0]] + clocks)
                s.sm_clock_max_mhz = max([s.sm_clock_max_mhz or 0] + clocks)
            for g in cards:
                s.throttle_reasons = sorted(set(s.throttle_reasons) | set(g.throttle_reasons))
            if f.gpu_simulated:
                s.gpu_note = "SIMULATED GPU (demo mode): not a real card"
        elif f.gpu_error:
            s.gpu_note = f.gpu_error
        if not self._pool:
            return
        if f.coverage_pct is not None:
            s.coverage_pct = round(f.coverage_pct, 1)
        if f.churn_per_s is not None:
            churn.append(f.churn_per_s)
