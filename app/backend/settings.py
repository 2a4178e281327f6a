"""Panel settings: the recipe, the data dir and demo mode, from CLI flags, the environment (app/backend/env.py)
and the recipe's defaults."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from app.backend import env
from app.backend.recipe import DEFAULT_RECIPE, SIMULATED_RECIPE, Recipe, load_recipe
from app.backend.recipe.command import validate_data_dir
from app.backend.recipe.endpoint import STATE_SUBDIR as STATE_SUBDIR  # the engine's socket lives in it too

if TYPE_CHECKING:  # types only: profiles reads settings, and is imported when first asked for
    from app.backend.profiles import ProfileRegistry


@dataclass(frozen=True)
class Settings:
    recipe_path: Path
    recipe: Recipe
    data_dir: Path
    demo: bool = False  # demo mode: the one switch every label, reader and metric reads (never recipe.simulated)
    demo_reason: str = ""  # why demo mode is on (shown on the page), '' when not known or not demo

    def __post_init__(self) -> None:
        if self.recipe.simulated and not self.demo:  # the SIMULATED recipe is demo mode, however it was loaded
            object.__setattr__(self, "demo", True)

    @property
    def state_dir(self) -> Path:
        """Where the panel keeps journals, logs, SQLite history (inside the data dir)."""
        return self.data_dir / STATE_SUBDIR

    @cached_property
    def profiles(self) -> ProfileRegistry:
        """The one profile registry of this recipe and data dir (recipe + custom, cached; app.backend.profiles):
        every lookup of a profile by id goes through it, so a saved custom profile is seen everywhere."""
        from app.backend.profiles import ProfileRegistry

        return ProfileRegistry(self)

    def ensure_state_dir(self) -> Path:
        """Create the state dir 0700 (and tighten an older one): it holds chat history, logs and
        journals, readable by this user only (docs/ui-and-safety.md#file-modes)."""
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.state_dir.stat().st_mode & 0o077:
            self.state_dir.chmod(0o700)
        return self.state_dir


def demo_data_dir() -> Path:
    """The per-user demo data dir (never the real /data/ds4): one data dir for demo mode, panel and CLI alike."""
    return env.data_home() / "moet-panel" / "demo"


def resolve_settings(recipe: str | Path | None = None, data_dir: str | Path | None = None, demo: bool = False,
                     demo_reason: str = "") -> Settings:
    """Combine CLI flags, environment and recipe defaults (flags win over env, env over defaults).

    Raises:
        RecipeError: the recipe file is missing or invalid.
        CommandError: the data dir is not a safe absolute path.
    """
    demo = demo or env.demo_requested()
    default = SIMULATED_RECIPE if demo else DEFAULT_RECIPE
    recipe_path = Path(recipe or env.recipe() or default).expanduser().resolve()
    loaded = load_recipe(recipe_path)
    raw_dir = str(data_dir or env.data_dir() or (demo_data_dir() if demo else loaded.default_data_dir))
    resolved = Path(validate_data_dir(str(Path(raw_dir).expanduser().absolute())))
    return Settings(recipe_path=recipe_path, recipe=loaded, data_dir=resolved, demo=demo,
                    demo_reason=demo_reason)
