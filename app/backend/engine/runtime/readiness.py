"""HTTP readiness probes (docs/engine.md, "States"): `/health` 200, then `/v1/models` lists the served name.

A refused connection just means "still starting" (vLLM binds its port only after loading).
"""

from __future__ import annotations

import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

import httpx

from app.backend import oplog
from app.backend.engine.runtime.client import connect_host, engine_client
from app.backend.recipe.endpoint import EngineEndpoint, EndpointError

CONNECT_TIMEOUT_S = 1.0
READ_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Probe:
    health_ok: bool
    models_ok: bool
    models: tuple[str, ...] = ()
    error: str = ""


def probe(url: str, served_name: str, read_timeout_s: float = READ_TIMEOUT_S) -> Probe:
    """One readiness probe. `read_timeout_s`: how long an accepted request may go unanswered (the reconcile's
    adoption probe uses a short one: a ready engine answers at once, and the watch must not wait on a busy one)."""
    timeout = httpx.Timeout(read_timeout_s, connect=CONNECT_TIMEOUT_S)
    client = engine_client(url)
    try:
        status = client.health(timeout)
        if status != 200:
            return Probe(False, False, error=f"/health answered {status}")
        try:
            ids = client.models(timeout)
        except httpx.HTTPStatusError as exc:
            return Probe(True, False, error=f"/v1/models answered {exc.response.status_code}")
        return Probe(True, served_name in ids, ids, "" if served_name in ids else f"/v1/models lists {list(ids)}")
    except (httpx.HTTPError, ValueError) as exc:
        return Probe(False, False, error=type(exc).__name__)


def port_in_use(host: str, port: int) -> bool:
    """True when something accepts connections on host:port (a stale server would answer /health)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((connect_host(host), port)) == 0


def socket_in_use(path: str) -> bool:
    """True when something accepts connections on the unix socket at `path` (a file left by a dead engine does not)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(path) == 0


def socket_dir_problem(sock_dir: Path) -> str:
    """Why the socket's directory is unsafe ('' when it is fine or absent): it must be ours and 0700, or another
    user of the box could reach the engine (docs/engine.md, "Where the engine listens")."""
    try:
        st = sock_dir.lstat()
    except FileNotFoundError:
        return ""
    if not stat.S_ISDIR(st.st_mode):
        return f"{sock_dir} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{sock_dir} belongs to uid {st.st_uid}, not to this panel's user"
    return ""


def claim_listen_address(address: str, who: str = oplog.PANEL) -> str:
    """Before a start: make the engine's listen address ready and free. A unix socket gets its 0700 directory
    (tightened if looser) and a socket file left by a dead engine is removed (vLLM's bind would fail on it);
    a TCP address is checked free. Returns why it cannot be used, '' when it can."""
    from app.backend.recipe.endpoint import ensure_socket_dir

    try:
        ep = EngineEndpoint.parse(address)
    except EndpointError as exc:
        return str(exc)
    if not ep.uds:
        return f"port {ep.port} is already bound by another process" if port_in_use(ep.host, ep.port) else ""
    path = Path(ep.uds)
    problem = socket_dir_problem(path.parent)
    if problem:
        return problem
    ensure_socket_dir(path.parent)
    if path.exists() or path.is_symlink():
        if socket_in_use(str(path)):
            return f"something already answers on the engine's socket {path}"
        path.unlink()
        # routine before every boot after a stop (issue 49: the old wording read like an error)
        oplog.decision("engine", "tidy-socket", who=who, path=str(path),
                       note="removed the last run's socket file before the boot (routine: nothing answers on it)")
    return ""
