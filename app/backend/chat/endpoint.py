"""Which engine the chat talks to, whether it can answer now, and why not.

Source of truth is the engine controller's snapshot (base URL, served name, profile, readiness,
diagnosis). Without a controller (CLI, unit tests) or with a URL the user typed, the recipe's
endpoint is probed with a short `GET /health`, cached briefly so a 1 s page timer costs nothing.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import httpx

from app.backend.contracts import Diagnosis, EngineSnapshot, SnapshotFn
from app.backend.engine.runtime.client import base_url, engine_client, server_root
from app.backend.recipe.schema import Recipe

ENGINE_TAB_HINT = "Start or fix it on the Engine tab."


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # server root, no /v1
    model: str  # served model name sent in requests
    profile_id: str | None
    simulated: bool
    source: Literal["engine", "recipe", "custom"]
    ready: bool
    reason: str = ""  # why not ready, one or two sentences; "" when ready
    diagnosis: Diagnosis | None = None  # when the controller has one
    build: str = ""  # the engine build serving (docs/engine.md "Upgrading the engine"); "" when unknown


class HealthProbe:
    """`GET /health` with a short timeout; results cached per URL for `ttl_s`."""

    def __init__(self, ttl_s: float = 2.0, timeout_s: float = 0.5):
        self._ttl = ttl_s
        self._timeout = timeout_s
        self._cache: dict[str, tuple[float, bool, str]] = {}
        self._lock = threading.Lock()

    def check(self, base_url: str) -> tuple[bool, str]:
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(base_url)
        if hit and now - hit[0] < self._ttl:
            return hit[1], hit[2]
        ok, reason = self._probe(base_url)
        with self._lock:
            self._cache[base_url] = (time.monotonic(), ok, reason)
        return ok, reason

    def _probe(self, base_url: str) -> tuple[bool, str]:
        try:
            status = engine_client(base_url).health(self._timeout)
        except httpx.ConnectError:
            return False, f"Nothing is listening at {base_url} (connection refused)."
        except httpx.HTTPError as exc:
            return False, f"The engine at {base_url} did not answer its health check ({type(exc).__name__})."
        if status == 200:
            return True, ""
        return False, f"The engine at {base_url} reports unhealthy (HTTP {status} on /health)."


def engine_reason(snapshot: EngineSnapshot) -> str:
    """Why a controller snapshot that is not READY cannot chat, with the diagnosis if there is one."""
    state = snapshot.state.value
    # Each fact once: the controller's message often already carries the diagnosis title ("engine stopped
    # outside the panel (exit code 0)"), and a parenthesised message inside parentheses reads badly (issue 29).
    parts = [p for p in (snapshot.phase or snapshot.message,) if p]
    d = snapshot.diagnosis
    if d is not None and not any(d.title.lower() in p.lower() for p in parts):
        parts.append(d.title)
    text = f"The engine is {state}" + (": " + "; ".join(parts) if parts else "")
    return f"{text}. {ENGINE_TAB_HINT}"


def resolve_endpoint(
    recipe: Recipe,
    data_dir: Path,  # the panel's engine listens on a socket inside it (recipe/endpoint.py)
    snapshot_fn: SnapshotFn | None,  # the controller's snapshot(); may return None (no controller)
    probe: HealthProbe,
    custom_url: str | None = None,
) -> Endpoint:
    if custom_url and custom_url.strip():
        url = server_root(custom_url)
        ok, reason = probe.check(url)
        return Endpoint(url, recipe.model.served_name, None, False, "custom", ok, reason)
    snap = snapshot_fn() if snapshot_fn is not None else None
    if snap is not None:
        url = server_root(snap.base_url) if snap.base_url else base_url(recipe, data_dir)
        ready = snap.is_ready
        return Endpoint(
            url, snap.served_name or recipe.model.served_name, snap.profile_id, snap.simulated, "engine",
            ready, "" if ready else engine_reason(snap), snap.diagnosis, snap.build,
        )
    url = base_url(recipe, data_dir)
    ok, reason = probe.check(url)
    return Endpoint(url, recipe.model.served_name, None, recipe.simulated, "recipe", ok, reason)
