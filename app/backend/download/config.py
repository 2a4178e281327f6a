"""Build a DownloadConfig from the recipe, the environment (HF_ENDPOINT, HF_TOKEN) and overrides."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from app.backend.config import env
from app.backend.download.types import DownloadConfig
from app.backend.config.hf_token import resolve_token
from app.backend.config.settings import Settings


def make_config(settings: Settings, *, dest: Path | None = None, endpoint: str | None = None,
                repo: str | None = None, revision: str | None = None, connections: int | None = None,
                token: str | None = None, token_file: str | None = None, **extra: Any) -> DownloadConfig:
    """Flags win over the environment, the environment over the recipe.

    HF_ENDPOINT is honoured only for the real recipe (the SIMULATED recipe's endpoint is local).
    """
    hub = settings.recipe.hub
    env_endpoint = None if settings.recipe.simulated else env.hf_endpoint()
    ep = (endpoint or env_endpoint or hub.endpoint).rstrip("/")
    the_repo = repo or hub.repo
    cfg = DownloadConfig(
        endpoint=ep, repo=the_repo, revision=revision or hub.revision, dest=Path(dest or settings.data_dir),
        token=resolve_token(token, token_file), recipe_repo=(the_repo == hub.repo),
        simulated=settings.demo,
    )
    if connections is not None:
        if not 1 <= connections <= 32:
            raise ValueError("--connections must be between 1 and 32")
        cfg = replace(cfg, connections=connections)
    return replace(cfg, **extra) if extra else cfg
