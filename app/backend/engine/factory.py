"""Wire an EngineController for the app: pick the runtime, the GPU reader, the profile list.

Runtime choice: Docker when reachable (for a simulated recipe the SIMULATED image is built on first
start if missing); otherwise, for simulated recipes only, the local-process runtime (labelled
SIMULATED); for real recipes no runtime (every start fails with the daemon-unreachable diagnosis,
and the next operation retries Docker).
"""

from __future__ import annotations

from typing import Callable

from app.backend.profiles.registry import ProfileRegistry
from app.backend.config import env
from app.backend.engine.answers import OtherProcessAnswers
from app.backend.engine.controller import EngineController
from app.backend.engine.fleet import Fleet, build_fleet
from app.backend.engine.ops import ControllerOptions
from app.backend.engine.docker_runtime import DockerRuntime
from app.backend.engine.imagebuild import image_build_running
from app.backend.engine.process_runtime import ProcessRuntime
from app.backend.engine.runtime import Runtime, RuntimeUnavailable
from app.backend.contracts import GpuReader
from app.backend.recipe.schema import ProfileSpec
from app.backend.config.settings import Settings


def select_runtime(settings: Settings, *, allow_process: bool = True) -> tuple[Runtime | None, str]:
    """(runtime, note). note explains a fallback or why there is no runtime."""
    docker_rt = DockerRuntime()
    try:
        docker_rt.check()
        return docker_rt, ""
    except RuntimeUnavailable as exc:
        # An explicit DOCKER_HOST names the daemon the user wants: report it unreachable, never swap in the
        # process runtime behind their back (docs/engine.md, "Runtimes").
        if settings.recipe.simulated and allow_process and not env.docker_host():
            return ProcessRuntime(settings.state_dir), f"{exc} — SIMULATED engine runs as a local process instead"
        return None, str(exc)


def ensure_sim_image(rt: Runtime) -> None:
    """Build the SIMULATED engine image (docker runtime only)."""
    if not isinstance(rt, DockerRuntime):
        return
    from app.backend.simengine.image import ensure_image

    ensure_image(rt.client)


def journal_artifact_status(settings: Settings, art_id: str) -> str | None:
    """The download journal's word on one artifact (read-only): "complete", a partial state with what to do,
    or None when no download was ever journaled here (preflight then looks at the directory)."""
    from app.backend.download.journal import JournalStore

    j = JournalStore(settings.data_dir).load(art_id)
    if j is None:
        return None
    if j.state == "done":
        return "complete"
    if j.extraction_started:
        return f"half-extracted ({len(j.files_done)} files; download {j.state}) — resume the download"
    verified = sum(1 for p in j.parts if p.status != "pending")
    return f"incomplete ({verified}/{len(j.parts)} parts verified; download {j.state}) — resume the download"


def artifact_status_fn(settings: Settings) -> Callable[[str], str | None]:
    """Preflight's artifact item reads the download journals (docs/engine.md, "Preflight")."""
    return lambda art_id: journal_artifact_status(settings, art_id)


def make_engine_controller(settings: Settings, gpu_reader: GpuReader,
                           options: ControllerOptions | None = None,
                           profiles_fn: Callable[[], list[ProfileSpec]] | None = None, *,
                           supervise: bool = False) -> EngineController:
    """The controller with its collaborators. `gpu_reader`: the app's one reader (the callers make it with
    `telemetry.gpu.make_gpu_reader` and, once the controller exists, let a SIMULATED card follow it with
    `telemetry.gpu.follow_engine`: the engine never builds a reader).
    `supervise`: the panel's controller brings back what should run and restarts crashes (docs/engine.md)."""
    from app.backend.service.config import ServiceConfigStore, effective_policy

    options = options or ControllerOptions()
    store = ServiceConfigStore(settings.state_dir)
    options.restart_policy_fn = lambda: effective_policy(store, settings.recipe.engine.restart)[0]
    options.drain_grace_fn = options.drain_grace_fn or (lambda: store.read().drain_grace_s)
    options.image_building_fn = options.image_building_fn or (lambda: image_build_running(settings.state_dir))
    options.supervise = options.supervise or supervise
    ctl = EngineController(
        settings,
        runtime_factory=lambda: select_runtime(settings),
        gpu_reader=gpu_reader,
        profiles_fn=profiles_fn or ProfileRegistry(settings).list,  # recipe + custom, re-read when saved
        options=options,
        ensure_image=ensure_sim_image,
        artifact_status=artifact_status_fn(settings),
    )
    # answers other processes on this data dir stream on this GPU (the panel's or a standalone gateway's, for a
    # CLI switch): drained too
    ctl.add_answer_counter(OtherProcessAnswers(settings.state_dir, options.gpu))
    return ctl


def make_fleet(settings: Settings, gpu_reader: GpuReader, gpu_count: int,
               options_fn: Callable[[int | None], ControllerOptions],
               profiles_fn: Callable[[], list[ProfileSpec]] | None = None, *, supervise: bool = False) -> Fleet:
    """One controller per GPU of the box (docs/engine.md "Several GPUs"): `gpu_count` engines for a recipe that
    serves on a GPU (or the SIMULATED box), else the recipe's one engine. `options_fn(gpu)` gives each its
    options (gpu None: the one-GPU box, built exactly as before)."""
    needs_gpu = settings.recipe.simulated or settings.recipe.requirements.gpu_count > 0
    count = gpu_count if needs_gpu else 1

    def make(gpu: int | None) -> EngineController:
        opts = options_fn(gpu)
        opts.gpu = gpu
        opts.box_engines = count
        return make_engine_controller(settings, gpu_reader, opts, profiles_fn, supervise=supervise)

    return build_fleet(count, make)
