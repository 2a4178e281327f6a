"""Is there a usable NVIDIA GPU and Docker engine? Decides demo mode for `moet-panel serve`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.backend.config import env

if TYPE_CHECKING:
    from app.backend.contracts import GpuReader


@dataclass(frozen=True)
class HostProbe:
    gpu_ok: bool
    gpu_detail: str
    docker_ok: bool
    docker_detail: str

    @property
    def demo_reason(self) -> str:
        """Why the panel must run in demo mode ('' when the real engine can run)."""
        reasons = []
        if not self.gpu_ok:
            reasons.append(f"no usable NVIDIA GPU ({self.gpu_detail})")
        if not self.docker_ok:
            reasons.append(f"no usable Docker engine ({self.docker_detail})")
        return "; ".join(reasons)


def probe_gpu(reader: "GpuReader | None" = None) -> tuple[bool, str]:
    """Through the panel's one GPU reader class (telemetry/nvml.py), not a second NVML client. A reader passed
    in is only read (serve and the CLI pass the process's one NVML reader, which the app state then keeps);
    one made here is closed again."""
    from app.backend.telemetry.nvml import NvmlGpuReader

    own = reader is None
    r = reader if reader is not None else NvmlGpuReader()
    try:
        if not r.available:
            return False, f"NVML unavailable: {r.error}"
        gpus = r.read()
        if not gpus:
            return False, "NVML reports 0 GPUs"
        return True, f"{len(gpus)} GPU(s), GPU 0: {gpus[0].name}"
    except Exception as exc:  # NVMLError_DriverNotLoaded and friends
        return False, f"NVML unavailable: {exc.__class__.__name__}: {exc}".rstrip(": ")
    finally:
        if own:
            r.close()


def probe_docker(timeout_s: float = 3.0) -> tuple[bool, str]:
    try:
        import docker

        client = docker.from_env(timeout=int(max(1, timeout_s)))
        try:
            client.ping()
            return True, f"Docker Engine {client.version().get('Version', '?')}"
        finally:
            client.close()
    except Exception as exc:  # DockerException (no socket), ConnectionError, permission denied ...
        return False, f"{exc.__class__.__name__}: {str(exc)[:160]}"


def probe_host(gpu_reader: "GpuReader | None" = None) -> HostProbe:
    gpu_ok, gpu_detail = probe_gpu(gpu_reader)
    docker_ok, docker_detail = probe_docker()
    return HostProbe(gpu_ok, gpu_detail, docker_ok, docker_detail)


DEMO_REQUESTED = f"requested (--demo / {env.DEMO}=1)"


def detect_demo(requested: bool, probe: HostProbe | None = None, gpu_reader: "GpuReader | None" = None) -> str:
    """Why demo mode is on ('' = off): asked for (the flag or the environment), or no usable GPU/Docker here. Serve and the CLI both use it;
    `gpu_reader` is the process's one NVML reader (probed here, kept by the engine and telemetry)."""
    if requested or env.demo_requested():
        return DEMO_REQUESTED
    return (probe or probe_host(gpu_reader)).demo_reason
