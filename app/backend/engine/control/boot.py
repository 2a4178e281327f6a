"""Boot and stop, on an operation's thread (docs/engine.md, "Start, stop, switch"): preflight -> prepare -> run ->
gate on ready, all on one spec; stop with grace and wait for the GPU memory to be released. A failed preflight
is classed by its CAUSE (restartpolicy.preflight_cause): Docker away, GPU memory not yet released or the port
briefly held heal by themselves and are retried; artifacts, the ckpt pin or ECC are not.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from app.backend.contracts import LIVE_STATES, Diagnosis, EngineSnapshot, EngineState, GpuReader, slots_of
from app.backend.engine.logs import diagnosis as diag_mod
from app.backend.engine.decider import statemachine as sm
from app.backend.engine.logs.bootlog import message_of
from app.backend.engine.builds.store import record_boot
from app.backend.engine.runtime.base import BUILD_LABEL
from app.backend.engine.control.reconciler import Reconciler
from app.backend.engine.control.site import Site
from app.backend.engine.logs.exits import ExitRecords
from app.backend.engine.logs.following import LogFollower
from app.backend.engine.logs.logstore import LogStore
from app.backend.engine.supervision.history import SupervisionStore
from app.backend.engine.logs.exits import explain_exit, is_failure
from app.backend.engine.lifecycle.gpurelease import wait_gpu_release
from app.backend.engine.errlog import ENGINE_ERRORS
from app.backend.engine.decider.facts import BootGated
from app.backend.engine.logs.loglines import pool_sizing
from app.backend.engine.lifecycle.tickets import expects_pool
from app.backend.engine.lifecycle.preflight import PreflightInputs, PreflightReport, run_preflight
from app.backend.engine.runtime.readiness import claim_listen_address, probe
from app.backend.engine.supervision.restartpolicy import preflight_cause
from app.backend.engine.runtime.base import Instance, Runtime, RuntimeOpError, RuntimeUnavailable
from app.backend.recipe.command import RunSpec


class Boot:
    """Boots and stops the engine for the operation in flight (its worker's thread): owns the run's gate and the
    container pids it reads; the decider gets each step as an event."""

    def __init__(self, site: Site, rec: Reconciler, follower: LogFollower, logs: LogStore, *,
                 gpu_reader: GpuReader | None, history: SupervisionStore, exit_records: ExitRecords,
                 note_exit: Callable[[Instance | None], None], kick: Callable[[], None],
                 cancel: threading.Event, wake: threading.Event, closing: threading.Event,
                 ensure_image: Callable[[Runtime], None] | None = None,
                 artifact_status: Callable[[str], str | None] | None = None) -> None:
        self.site, self.options, self.recipe = site, site.options, site.recipe
        self.rec = rec
        self.follower = follower
        self.logs = logs
        self.gpu_reader = gpu_reader
        self.history = history
        self.exit_records = exit_records
        self._note_exit = note_exit  # the observer's: this exit is explained here
        self._kick = kick  # the observer's: look at Docker now
        self._cancel, self._wake, self._closing = cancel, wake, closing  # wake the waits: a stop's cancel, close
        self.ensure_image = ensure_image
        self.artifact_status = artifact_status
        self._pids_cache: tuple[float, str, set[int]] = (0.0, "", set())

    def container_pids(self) -> set[int]:
        """The shown run's processes (cached 2 s): the GPU release waits for their memory."""
        snap = self.rec.snapshot()
        rt = self.site.runtime
        if not snap.container_id or rt is None or snap.state not in LIVE_STATES | {EngineState.STOPPING}:
            return set()
        ts, cid, pids = self._pids_cache
        if cid == snap.container_id and time.monotonic() - ts < 2.0:
            return set(pids)
        try:
            pids = rt.pids(snap.container_id)
        except (RuntimeUnavailable, RuntimeOpError):
            pids = set()
        self._pids_cache = (time.monotonic(), snap.container_id, pids)
        return set(pids)

    def fail(self, d: Diagnosis, message: str) -> None:
        """The operation failed: FAILED with `d`; a run this panel judged keeps its record (any process reads it)."""
        snap = self.rec.apply(sm.Failed(d, message))
        if snap.container_id:  # (pool not loaded, boot timeout)
            self.exit_records.record(snap.container_id, d)

    def preflight(self, spec: RunSpec, overrides: frozenset[str]) -> PreflightReport:
        rt = self.site.get_runtime(force=True)
        snap = self.rec.snapshot()
        inputs = PreflightInputs(
            recipe=self.recipe, env=spec.env_dict, data_dir=self.site.settings.data_dir, runtime=rt,
            runtime_error=self.site.runtime_error, gpu_reader=self.gpu_reader,
            engine_running=snap.state in LIVE_STATES or self._panel_engine_running(rt),
            engine_pids=self.container_pids(),
            artifact_status=self.artifact_status, gpu=self.options.gpu, engines=self.options.box_engines,
        )
        return run_preflight(inputs, overrides)

    def _panel_engine_running(self, rt: Runtime | None) -> bool:
        """A container with this panel's labels runs (whoever started it): the port holder is ours."""
        try:
            return rt is not None and any(i.running for i in self.site.list_mine(rt))
        except (RuntimeUnavailable, RuntimeOpError):
            return False

    def boot_profile(self, profile_id: str, build: str | None = None) -> bool:
        """Boot a profile the operation did not ask for (rollback, stall restart, supervised restart) from a spec
        built now, on `build` (None: the current build)."""
        try:
            spec = self.site.run_spec(profile_id, build=build)
        except (KeyError, ValueError) as exc:  # e.g. the custom profile was deleted meanwhile
            d = diag_mod.HINTS["preflight_failed"]
            self.fail(Diagnosis(d.reason, d.title, str(exc), d.fix), f"cannot build {profile_id}: {exc}")
            return False
        return self.boot(profile_id, spec, frozenset())

    def boot(self, profile_id: str, spec: RunSpec, overrides: frozenset[str]) -> bool:
        """Preflight -> prepare -> run -> gate on ready, all on this one spec. Leaves the state READY or FAILED."""
        self.rec.apply(sm.PreflightBegan(profile_id))
        began = time.monotonic()
        report = self.preflight(spec, overrides)
        if not report.ok:
            blocking = report.blocking()
            bad = tuple(f"{i.title}: {i.detail} — fix: {i.fix}" for i in blocking)
            building = self.options.image_building_fn is not None and self.options.image_building_fn()
            cause = preflight_cause([i.id for i in blocking], image_building=building)
            d = diag_mod.HINTS.get(cause, diag_mod.HINTS["preflight_failed"])
            title = d.title if cause == "preflight_failed" else f"Preflight: {d.title}"
            self.fail(Diagnosis(cause, title, d.explanation, d.fix, bad), "preflight failed: " + report.summary())
            return False
        rt = self.site.get_runtime(force=True)
        if rt is None:
            self.fail(self.site.runtime_failure(RuntimeUnavailable(self.site.runtime_error)), self.site.runtime_error)
            return False
        hint = self._prepare(rt, spec)
        if hint:
            self.fail(diag_mod.classify(None, False, [], hint=hint[0]), hint[1])
            return False
        try:
            inst = rt.run(spec, self.options.extra_labels)
        except RuntimeOpError as exc:
            self.fail(diag_mod.classify(None, False, [str(exc)], hint=exc.reason), str(exc))
            return False
        self.follower.begin(rt, inst, from_start=True)
        self.rec.apply(sm.BootBegan(profile_id, inst.id, inst.name, self.site.address(),
                                 self.recipe.model.served_name, self.recipe.simulated,
                                 build=dict(spec.labels).get(BUILD_LABEL, ""), image=spec.image))
        ready = self.await_ready(rt, inst, spec.env_dict)
        if ready:  # the drain's Retry-After for the next stop or switch (docs/engine.md "Keeps serving")
            self.history.booted(profile_id, time.monotonic() - began)
        if build := dict(spec.labels).get(BUILD_LABEL, ""):  # evidence for the build (evidence/builds.py)
            diag = self.rec.snapshot().diagnosis
            record_boot(self.site.settings, build, profile_id, ready, time.monotonic() - began,
                        diag.title if diag is not None else "")
        return ready

    def _prepare(self, rt: Runtime, spec: RunSpec) -> tuple[str, str] | None:
        """Clean up our stopped containers; refuse foreign name holders, running twins, a bound port."""
        holder = rt.get(spec.name)
        if holder is not None and not holder.managed:
            return "name_conflict", f"container name {spec.name} is held by a container this panel did not create"
        for inst in self.site.list_mine(rt):
            if inst.running:
                return "port_in_use", f"panel engine {inst.name} is still running; stop it first"
            rt.remove(inst.id)
        if busy := claim_listen_address(self.site.address()):  # its socket dir, or port
            return "port_in_use", busy
        if not rt.image_present(spec.image):
            if self.recipe.simulated and self.ensure_image is not None:
                self.rec.apply(sm.Noted(f"building the SIMULATED engine image {spec.image}…"))
                self.ensure_image(rt)
            elif self.options.image_building_fn is not None and self.options.image_building_fn():
                return "image_building", f"image {spec.image} is not present yet: a build is running"
            else:
                return "image_missing", f"image {spec.image} is not present"
        return None

    def await_ready(self, rt: Runtime, inst: Instance, env: dict[str, str], *, watch_only: bool = False) -> bool:
        """Gate on ready. `watch_only` (an adopted engine someone else started): the reconcile keeps running
        meanwhile and owns what happens when Docker changes — this loop ends as soon as the snapshot stops
        showing `inst`, and leaves an exit for the reconcile to explain."""
        url, name = self.site.address(), self.recipe.model.served_name
        want_pool = expects_pool(env, self.recipe.engine.pool_line)
        deadline = time.monotonic() + self.recipe.engine.boot_timeout_s
        pool_deadline: float | None = None
        while not self._closing.is_set() and not self._cancel.is_set() and \
                _shows_booting(self.rec.snapshot(), inst.id):
            cur = rt.get(inst.id)
            if cur is None or not cur.running:
                if watch_only:
                    self._kick()
                    return False
                self.follower.drain()
                return self._fail_exited(cur)
            p = probe(url, name)
            if p.health_ok and p.models_ok:
                prog = self.follower.tracker.progress
                if not want_pool or (slots_of(prog.pool) or 0) > 0:
                    # applied only if the reconciler still shows this run booting (it may have moved on: replaced,
                    # gone) when it reads the message
                    return self.rec.propose(BootGated(inst.id, sm.BecameReady(self._ready_message(want_pool))))[0]
                pool_deadline = pool_deadline or time.monotonic() + self.options.pool_line_grace_s
                if slots_of(prog.pool) == 0:
                    return self._fail_and_stop(rt, inst, "pool_not_loaded")
                if time.monotonic() > pool_deadline:
                    shown = _tail_shows_pool(rt, inst.id)
                    if shown is None:
                        # the tail was not read (a loaded or absent daemon): unknown, not "no pool"; asked again
                        # after another grace, within the boot's own deadline
                        pool_deadline = time.monotonic() + self.options.pool_line_grace_s
                    elif shown:
                        # the engine's own log has the line: it is ready. The follower lags (a loaded box) or began
                        # after the line (a boot adopted midway, another process's start): waiting for it to catch
                        # up stopped a good engine as "pool not loaded" 30 s later (the chaos soak in 3 workers)
                        return self.rec.propose(BootGated(inst.id, sm.BecameReady(self._ready_message(want_pool))))[0]
                    else:
                        return self._fail_and_stop(rt, inst, "pool_not_loaded")
            if time.monotonic() > deadline:
                return self._fail_and_stop(rt, inst, "boot_timeout")
            self._wake.wait(self.options.poll_interval_s)
        return False  # panel closing (engine left as it is), cancelled by stop (the stop op follows), or moved on

    def _ready_message(self, want_pool: bool) -> str:
        prog = self.follower.tracker.progress
        if prog.cache_miss:
            return "ready, but the planes cache MISSED during boot: " + diag_mod.cache_miss_warning()
        return "" if want_pool else "ready (this profile has no FP4 pool)"

    def _fail_exited(self, cur: Instance | None) -> bool:
        lines = [ln.text for ln in self.logs.recent(400)]
        code = cur.exit_code if cur else None
        d = explain_exit(cur, lines, cache_miss=self.follower.tracker.progress.cache_miss)
        self._note_exit(cur)
        if is_failure(d):
            self.fail(d, f"engine exited (code {code}): {d.title}")
        else:
            self.follower.end()
            self.rec.apply(sm.Vanished(f"engine {d.title}" + (f" (exit code {code})" if code is not None else ""), d))
        return False

    def _fail_and_stop(self, rt: Runtime, inst: Instance, hint: str) -> bool:
        lines = [ln.text for ln in self.logs.recent(400)]
        d = diag_mod.classify(None, False, lines, hint=hint, cache_miss=self.follower.tracker.progress.cache_miss)
        rt.stop(inst.id, self.recipe.engine.stop_grace_s)  # it holds the GPU and must not serve
        self.follower.drain()
        self.fail(d, d.title)
        return False

    # -- stop / release ----------------------------------------------------------------------
    def stop_engine(self, message: str, release_pids: set[int] | None = None) -> bool:
        """Stop every running panel engine of this recipe (normally one) and remove it; with release_pids,
        stay in `stopping` until the GPU reader shows that memory released. False = not released."""
        rt = self.site.get_runtime(force=True)
        snap = self.rec.snapshot()
        if rt is None:
            if snap.state is not EngineState.STOPPED:
                self.fail(self.site.runtime_failure(RuntimeUnavailable(self.site.runtime_error)), self.site.runtime_error)
            return True
        mine = self.site.list_mine(rt)
        targets = [i for i in mine if i.running]
        leftovers = [i for i in mine if not i.running]  # e.g. the failed run kept for inspection
        if snap.state is EngineState.STOPPED and not targets:
            for inst in leftovers:
                rt.remove(inst.id)
            return True
        if snap.state is not EngineState.STOPPING:
            self.rec.apply(sm.StopBegan(message))
        stopped = []
        for inst in targets:
            final = rt.stop(inst.id, self.recipe.engine.stop_grace_s)
            stopped.append(final or inst)
        self.follower.drain()
        self.follower.end()
        for inst in stopped + leftovers:
            rt.remove(inst.id)  # logs are persisted by the panel; exit code already read
        if release_pids is not None:
            self.rec.apply(sm.Noted(f"{message}: waiting for the GPU memory to be released"))
            if not self.wait_gpu_release(release_pids):
                d = diag_mod.HINTS["gpu_not_released"]
                self.fail(d, d.title)
                return False
        self.rec.apply(sm.Stopped(message))
        return True

    def stop_and_release(self, message: str) -> bool:
        return self.stop_engine(message, release_pids=self.container_pids())

    def wait_gpu_release(self, old_pids: set[int]) -> bool:
        """Poll the GPU reader until the old engine's memory is gone (deadline from options)."""
        no_gpu = self.recipe.requirements.gpu_count == 0 and not (self.gpu_reader is not None and self.gpu_reader.simulated)
        return wait_gpu_release(self.gpu_reader, old_pids, threshold=self.options.gpu_release_bytes,
                                timeout_s=self.options.gpu_release_timeout_s,
                                poll_s=min(0.5, self.options.poll_interval_s * 2), stop=self._wake, skip=no_gpu,
                                gpu=self.options.gpu)


def _shows_booting(snap: EngineSnapshot, cid: str) -> bool:
    """The snapshot shows this container booting (a preflight before BootBegan counts)."""
    return snap.state is EngineState.PREFLIGHT or (snap.state is EngineState.STARTING and snap.container_id == cid)


def _tail_shows_pool(rt: Runtime, cid: str, lines: int = 2000) -> bool | None:
    """Whether the container's own log (not the follower's copy) has a pool sizing line with slots; None when the
    log could not be read."""
    try:
        tail = rt.tail_logs(cid, lines)
    except (RuntimeUnavailable, RuntimeOpError) as exc:
        ENGINE_ERRORS.caught("reading the engine's log tail for its pool line", exc)
        return None
    return any((slots_of(pool_sizing(message_of(text))) or 0) > 0 for _, text in tail)
