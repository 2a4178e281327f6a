"""Is there a usable NVIDIA GPU and Docker engine? Decides demo mode for `moet-panel serve`."""

from __future__ import annotations

from dataclasses import dataclass


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


def probe_gpu() -> tuple[bool, str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count < 1:
                return False, "NVML reports 0 GPUs"
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
            return True, f"{count} GPU(s), GPU 0: {name if isinstance(name, str) else name.decode()}"
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ImportError ...
        return False, f"NVML unavailable: {exc.__class__.__name__}: {exc}".rstrip(": ")


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


def probe_host() -> HostProbe:
    gpu_ok, gpu_detail = probe_gpu()
    docker_ok, docker_detail = probe_docker()
    return HostProbe(gpu_ok, gpu_detail, docker_ok, docker_detail)
