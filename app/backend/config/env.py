"""Every environment variable the panel reads, read here and nowhere else in app/ (modelled on
huggingface_hub's `constants.py`: one module of names and typed accessors). docs/configuration.md has
the table a user reads; tests/test_env.py keeps other modules from reading the environment themselves.

Accessors read at call time, not at import: the CLI, the tests and `serve` may set a variable after
this module is imported. Flags always win over these (the callers apply them first).

The SIMULATED engine (app/backend/simengine/) is the exception: it is a separate program that runs in
its own container and reads its own `MOET_SIM_*` variables, as vLLM reads its own (docs/simengine.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

RECIPE = "MOET_PANEL_RECIPE"
DATA_DIR = "MOET_PANEL_DATA_DIR"
DEMO = "MOET_PANEL_DEMO"
AUTH_FILE = "MOET_PANEL_AUTH_FILE"
METRICS_TOKEN_FILE = "MOET_PANEL_METRICS_TOKEN_FILE"
ALLOWED_HOSTS = "MOET_PANEL_ALLOWED_HOSTS"
GPU = "MOET_PANEL_GPU"
SIM_GPUS = "MOET_PANEL_SIM_GPUS"
SIM_GPUS_MAX = 16
SERVER_NAME = "GRADIO_SERVER_NAME"
SERVER_PORT = "GRADIO_SERVER_PORT"
WEB_TEMP_DIR = "GRADIO_TEMP_DIR"
HF_TOKEN = "HF_TOKEN"
HF_TOKEN_LEGACY = "HUGGING_FACE_HUB_TOKEN"
HF_ENDPOINT = "HF_ENDPOINT"
HF_OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
DOCKER_HOST = "DOCKER_HOST"
GATEWAY_HOST = "MOET_PANEL_GATEWAY_HOST"
GATEWAY_PORT = "MOET_PANEL_GATEWAY_PORT"
GATEWAY_TLS_CERT = "MOET_PANEL_GATEWAY_TLS_CERT"
GATEWAY_TLS_KEY = "MOET_PANEL_GATEWAY_TLS_KEY"
ENGINE_RESTART = "MOET_PANEL_ENGINE_RESTART"
NOTIFY = "MOET_PANEL_NOTIFY"
NOTIFY_SOCKET = "NOTIFY_SOCKET"  # systemd's sd_notify socket (Type=notify units)
WATCHDOG_USEC = "WATCHDOG_USEC"  # systemd's WatchdogSec= in µs, with WATCHDOG_PID (sd_watchdog_enabled(3))
WATCHDOG_PID = "WATCHDOG_PID"

GpuMode = Literal["nvml", "simulated", "none"]
_TRUE = {"1", "ON", "YES", "TRUE"}


def _get(name: str) -> str | None:
    """The variable's value with surrounding blanks removed; None when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def recipe() -> str | None:
    return _get(RECIPE)


def data_dir() -> str | None:
    return _get(DATA_DIR)


def demo_requested() -> bool:
    return _get(DEMO) == "1"


def auth_file() -> str | None:
    return _get(AUTH_FILE)


def metrics_token_file() -> str | None:
    """The bearer-token file that opens /metrics when the panel has a login (docs/metrics.md#access)."""
    return _get(METRICS_TOKEN_FILE)


def allowed_hosts() -> str:
    """Comma-separated extra Host names for the web gate (app/backend/web/gate.py parses them)."""
    return _get(ALLOWED_HOSTS) or ""


def gpu_mode() -> GpuMode | None:
    """The GPU reader override, or None (auto). A bad value raises with the accepted list."""
    raw = (_get(GPU) or "").lower()
    if not raw:
        return None
    if raw == "nvml":
        return "nvml"
    if raw == "simulated":
        return "simulated"
    if raw == "none":
        return "none"
    raise ValueError(f"{GPU}={raw!r}: expected nvml, simulated or none")


def sim_gpus() -> int:
    """How many GPUs the SIMULATED box has (demo only; default 1; docs/engine.md "Several GPUs"). A bad value
    raises with what is accepted."""
    return sim_gpus_given() or 1


def sim_gpus_given() -> int | None:
    """MOET_PANEL_SIM_GPUS when set (config/simbox.py remembers it in the data dir), else None."""
    raw = _get(SIM_GPUS)
    if raw is None:
        return None
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= SIM_GPUS_MAX:
        raise ValueError(f"{SIM_GPUS}={raw!r}: expected a whole number from 1 to {SIM_GPUS_MAX}")
    return n


def server_name() -> str | None:
    return _get(SERVER_NAME)


def server_port() -> int | None:
    raw = _get(SERVER_PORT)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{SERVER_PORT}={raw!r}: expected a port number") from None


def gateway_host() -> str | None:
    return _get(GATEWAY_HOST)


def gateway_port() -> int | None:
    raw = _get(GATEWAY_PORT)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{GATEWAY_PORT}={raw!r}: expected a port number") from None


def gateway_tls() -> tuple[str | None, str | None]:
    """(certificate file, key file) for the API gateway's TLS (docs/gateway.md)."""
    return _get(GATEWAY_TLS_CERT), _get(GATEWAY_TLS_KEY)


def hf_token() -> str | None:
    """The token the environment gives (HF_TOKEN, else the older HUGGING_FACE_HUB_TOKEN)."""
    return _get(HF_TOKEN) or _get(HF_TOKEN_LEGACY)


def hf_endpoint() -> str | None:
    return _get(HF_ENDPOINT)


def hf_offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as huggingface_hub spells true."""
    return any((_get(name) or "").upper() in _TRUE for name in HF_OFFLINE)


def docker_host() -> str | None:
    """An explicit DOCKER_HOST, or None (the default socket)."""
    return _get(DOCKER_HOST)


def engine_restart() -> Literal["on-failure", "never"] | None:
    """The restart policy override (docs/engine.md, "Keeps serving"), or None. A bad value raises."""
    raw = (_get(ENGINE_RESTART) or "").lower()
    if not raw:
        return None
    if raw == "on-failure":
        return "on-failure"
    if raw == "never":
        return "never"
    raise ValueError(f"{ENGINE_RESTART}={raw!r}: expected on-failure or never")


def notify_urls() -> list[str]:
    """Apprise URLs to send alerts to (space-separated), [] when unset."""
    return (_get(NOTIFY) or "").split()


def notify_socket() -> str | None:
    """systemd's notification socket path (set by systemd for Type=notify), or None."""
    return _get(NOTIFY_SOCKET)


def watchdog_usec() -> int | None:
    """systemd's watchdog period for this process (µs), or None when no watchdog is set (or it is another
    process's: $WATCHDOG_PID names the pid it is meant for, as sd_watchdog_enabled(3) checks)."""
    raw, pid = _get(WATCHDOG_USEC), _get(WATCHDOG_PID)
    if raw is None or (pid is not None and pid != str(os.getpid())):
        return None
    try:
        value = int(raw)
    except ValueError:
        return None
    return value if value > 0 else None


def config_home() -> Path:
    return Path(_get("XDG_CONFIG_HOME") or Path.home() / ".config")


def cache_home() -> Path:
    return Path(_get("XDG_CACHE_HOME") or Path.home() / ".cache")


def data_home() -> Path:
    return Path(_get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def inherited(names: Iterable[str] = (), prefixes: tuple[str, ...] = ()) -> dict[str, str]:
    """The variables a child process inherits by name or by prefix (never the whole environment unasked)."""
    wanted = set(names)
    return {k: v for k, v in os.environ.items() if k in wanted or (prefixes and k.startswith(prefixes))}


def whole() -> dict[str, str]:
    """A copy of the whole environment, for a child that needs it as the user's shell has it (docker build)."""
    return dict(os.environ)


def point_web_temp_dir(path: Path) -> None:
    """Point Gradio's upload/cache folder (GRADIO_TEMP_DIR) at the panel's own per-process folder under
    its 0700 state dir (app/backend/web/exports.py), never the shared /tmp/gradio. Always set, a user's value
    included: files handed to the browser must stay private to this panel (docs/ui-and-safety.md). Gradio
    reads it when a component or the web app is built, so this runs before the UI is built."""
    os.environ[WEB_TEMP_DIR] = str(path)


def set_default(name: str, value: str) -> None:
    """Set a variable for this process and its children unless the user set it (library opt-outs)."""
    os.environ.setdefault(name, value)
