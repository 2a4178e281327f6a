"""The profiles a user can serve: the recipe's, plus custom ones saved in the data dir."""

from __future__ import annotations

from app.backend.custom_profiles import load_custom_profiles
from app.backend.recipe.schema import ProfileSpec
from app.backend.settings import Settings


def all_profiles(settings: Settings) -> list[ProfileSpec]:
    """Recipe profiles first, then custom profiles (see app.backend.custom_profiles)."""
    return list(settings.recipe.profiles) + load_custom_profiles(settings)
