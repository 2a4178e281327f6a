"""The Service tab's settings, kept in `<state_dir>/service.json` (docs/engine.md, "Keeps serving").

The file holds Apprise URLs with passwords and tokens: it is written 0600 (issue 40 item 7), and every URL read
is registered with `app.backend.redact`, so no log line shows its secrets.

Precedence for each: the environment (MOET_PANEL_ENGINE_RESTART, MOET_PANEL_NOTIFY; read in env.py) wins,
then this file (set in the panel), then the recipe's default.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from app.backend import env, redact
from app.backend.fileio import atomic_write
from app.backend.engine.restartpolicy import RestartPolicy, parse_policy


@dataclass(frozen=True)
class ServiceConfig:
    restart_policy: RestartPolicy | None = None  # None = the recipe's engine.restart
    notify_urls: tuple[str, ...] = field(default_factory=tuple)
    drain_grace_s: float | None = None  # None = the recipe's engine.drain_grace_s (docs/engine.md "Keeps serving")


class ServiceConfigStore:
    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / "service.json"

    def read(self) -> ServiceConfig:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return ServiceConfig()
        try:
            policy = parse_policy(raw["restart_policy"]) if raw.get("restart_policy") else None
        except (ValueError, AttributeError):
            policy = None
        urls = tuple(str(u) for u in (raw.get("notify_urls") or []) if isinstance(u, str) and u.strip())
        for u in urls:
            redact.register_url(u)
        grace = raw.get("drain_grace_s")
        return ServiceConfig(policy, urls,
                             float(grace) if isinstance(grace, (int, float)) and 0 <= grace <= 3600 else None)

    def write(self, cfg: ServiceConfig) -> None:
        """Raises OSError (the old file intact). The file is created 0600 and an older, looser one tightened."""
        for u in cfg.notify_urls:
            redact.register_url(u)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps({"restart_policy": cfg.restart_policy,
                                            "notify_urls": list(cfg.notify_urls),
                                            "drain_grace_s": cfg.drain_grace_s}, indent=2), mode=0o600)


def effective_policy(store: ServiceConfigStore, recipe_default: RestartPolicy) -> tuple[RestartPolicy, str]:
    """(policy, where it comes from: "environment" | "panel setting" | "recipe")."""
    from_env = env.engine_restart()
    if from_env is not None:
        return from_env, "environment (MOET_PANEL_ENGINE_RESTART)"
    saved = store.read().restart_policy
    if saved is not None:
        return saved, "panel setting"
    return recipe_default, "recipe"


def effective_notify_urls(store: ServiceConfigStore) -> tuple[tuple[str, ...], str]:
    """(urls, where they come from). MOET_PANEL_NOTIFY, when set, replaces the panel's list."""
    from_env = env.notify_urls()
    if from_env:
        for u in from_env:
            redact.register_url(u)
        return tuple(from_env), "environment (MOET_PANEL_NOTIFY)"
    return store.read().notify_urls, "panel setting"
