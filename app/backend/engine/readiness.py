"""HTTP readiness probes (docs/engine.md, "States"): `/health` 200, then `/v1/models` lists the served name.

A refused connection just means "still starting" (vLLM binds its port only after loading).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

import httpx

from app.backend.recipe.schema import Recipe

CONNECT_TIMEOUT_S = 1.0
READ_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Probe:
    health_ok: bool
    models_ok: bool
    models: tuple[str, ...] = ()
    error: str = ""


def base_url(recipe: Recipe) -> str:
    host = recipe.serve.host if recipe.serve.host not in ("0.0.0.0", "") else "127.0.0.1"
    return f"http://{host}:{recipe.serve.port}"


def probe(url: str, served_name: str, client: httpx.Client | None = None, read_timeout_s: float = READ_TIMEOUT_S) -> Probe:
    """One readiness probe. `read_timeout_s`: how long an accepted request may go unanswered (the reconcile's
    adoption probe uses a short one: a ready engine answers at once, and the watch must not wait on a busy one)."""
    timeout = httpx.Timeout(read_timeout_s, connect=CONNECT_TIMEOUT_S)
    own = client is None
    c = client or httpx.Client(timeout=timeout)
    try:
        r = c.get(f"{url}/health", timeout=timeout)
        if r.status_code != 200:
            return Probe(False, False, error=f"/health answered {r.status_code}")
        r = c.get(f"{url}/v1/models", timeout=timeout)
        if r.status_code != 200:
            return Probe(True, False, error=f"/v1/models answered {r.status_code}")
        ids = tuple(str(m.get("id", "")) for m in (r.json().get("data") or []) if isinstance(m, dict))
        return Probe(True, served_name in ids, ids, "" if served_name in ids else f"/v1/models lists {list(ids)}")
    except (httpx.HTTPError, ValueError) as exc:
        return Probe(False, False, error=type(exc).__name__)
    finally:
        if own:
            c.close()


def port_in_use(host: str, port: int) -> bool:
    """True when something accepts connections on host:port (a stale server would answer /health)."""
    target = host if host not in ("0.0.0.0", "") else "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((target, port)) == 0
