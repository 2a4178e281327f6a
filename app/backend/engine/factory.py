"""Wire an EngineController for the app: pick the runtime, the GPU reader, the profile list.

Runtime choice: Docker when reachable (for a simulated recipe the SIMULATED image is built on first
start if missing); otherwise, for simulated recipes only, the local-process runtime (labelled
SIMULATED); for real recipes no runtime (every start fails with the daemon-unreachable diagnosis,
and the next operation retries Docker).
"""

from __future__ import annotations

from typing import Callable

from app.backend.engine.controller import ControllerOptions, EngineController
from app.backend.engine.docker_runtime import DockerRuntime
from app.backend.engine.process_runtime import ProcessRuntime
from app.backend.engine.runtime import Runtime, RuntimeUnavailable
from app.backend.settings import Settings
from app.backend.telemetry.gpu_types import GpuReader


def select_runtime(settings: Settings, *, allow_process: bool = True) -> tuple[Runtime | None, str]:
    """(runtime, note). note explains a fallback or why there is no runtime."""
    docker_rt = DockerRuntime()
    try:
        docker_rt.check()
        return docker_rt, ""
    except RuntimeUnavailable as exc:
        if settings.recipe.simulated and allow_process:
            return ProcessRuntime(settings.state_dir), f"{exc} — SIMULATED engine runs as a local process instead"
        return None, str(exc)


def ensure_sim_image(rt: Runtime) -> None:
    """Build the SIMULATED engine image (docker runtime only)."""
    if not isinstance(rt, DockerRuntime):
        return
    from app.backend.simengine.image import ensure_image

    ensure_image(rt.client)


def artifact_status_fn(settings: Settings) -> Callable[[str], str | None] | None:
    """The download helper's per-artifact status, when its module exposes one."""
    try:
        from app.backend.download import artifact_status  # type: ignore[attr-defined]
    except (ImportError, AttributeError):
        return None
    return lambda art_id: artifact_status(settings, art_id)


def default_gpu_reader(settings: Settings, controller_ref: list[EngineController]) -> GpuReader | None:
    try:
        from app.backend.telemetry.gpu import make_gpu_reader
    except ImportError:
        return None

    def snap():  # late-bound: the controller does not exist yet while the reader is made
        return controller_ref[0].snapshot()

    def pids() -> set[int]:
        return controller_ref[0].container_pids() if controller_ref else set()

    return make_gpu_reader(settings, engine_snapshot_fn=snap, engine_pids_fn=pids)


def make_engine_controller(settings: Settings, gpu_reader: GpuReader | None = None,
                           options: ControllerOptions | None = None) -> EngineController:
    from app.backend.profiles import all_profiles

    ref: list[EngineController] = []
    reader = gpu_reader if gpu_reader is not None else default_gpu_reader(settings, ref)
    ctl = EngineController(
        settings,
        runtime_factory=lambda: select_runtime(settings),
        gpu_reader=reader,
        profiles_fn=lambda: all_profiles(settings),
        options=options,
        ensure_image=ensure_sim_image,
        artifact_status=artifact_status_fn(settings),
    )
    ref.append(ctl)
    return ctl
