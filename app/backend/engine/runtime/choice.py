"""Pick the engine's runtime (the controllers themselves are wired in `app/backend/state.py`).

Runtime choice: Docker when reachable (for a simulated recipe the SIMULATED image is built on first
start if missing); otherwise, for simulated recipes only, the local-process runtime (labelled
SIMULATED); for real recipes no runtime (every start fails with the daemon-unreachable diagnosis,
and the next operation retries Docker).
"""

from __future__ import annotations

from app.backend.config import env
from app.backend.engine.runtime.docker import DockerRuntime
from app.backend.engine.runtime.process import ProcessRuntime
from app.backend.engine.runtime.base import Runtime, RuntimeUnavailable
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
