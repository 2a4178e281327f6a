"""The Service tab's settings, kept in `<state_dir>/service.json` (docs/engine.md, "Keeps serving").

The file holds Apprise URLs with passwords and tokens: it is written 0600 (issue 40 item 7), and every URL read
is registered with `app.backend.oplog.redact`, so no log line shows its secrets.

Precedence for each: the environment (MOET_PANEL_ENGINE_RESTART, MOET_PANEL_NOTIFY; read in env.py) wins,
then this file (set in the panel), then the recipe's default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import Field

from app.backend.config import env

from app.backend.oplog import redact
from app.backend.files.jsonstore import JsonStore
from app.backend.engine.supervision.restartpolicy import RestartPolicy


@dataclass(frozen=True)
class ServiceConfig:
    restart_policy: RestartPolicy | None = None  # None = the recipe's engine.restart
    notify_urls: tuple[str, ...] = field(default_factory=tuple)
    # None = the recipe's engine.drain_grace_s (docs/engine.md "Keeps serving")
    drain_grace_s: Annotated[float, Field(ge=0, le=3600)] | None = None


class ServiceConfigStore:
    def __init__(self, state_dir: Path) -> None:
        self._store = JsonStore(Path(state_dir) / "service.json", ServiceConfig)  # 0600: URLs hold secrets
        self.path = self._store.path

    def read(self) -> ServiceConfig:
        cfg = self._store.read() or ServiceConfig()
        for u in cfg.notify_urls:
            redact.register_url(u)
        return cfg

    def write(self, cfg: ServiceConfig) -> None:
        """Raises OSError (the old file intact). The file is created 0600 and an older, looser one tightened."""
        for u in cfg.notify_urls:
            redact.register_url(u)
        self._store.write(cfg)


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
