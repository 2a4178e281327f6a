"""The alert policy reads the profile's effective command (app.backend.recipe.effective), custom profiles too."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from app.backend.profiles.registry import ProfileRegistry
from app.backend.profiles import custom as cp
from app.backend.recipe import DEFAULT_RECIPE
from app.backend.config.settings import resolve_settings
from app.backend.alerts.rules import profile_policy


def test_policy_of_card_profiles_and_the_base_command(tmp_path: Path) -> None:
    settings = resolve_settings(DEFAULT_RECIPE, tmp_path)
    assert profile_policy(settings, "quality") == "freq"
    assert profile_policy(settings, "speed") == "need"  # env_replace
    assert profile_policy(settings, None) == "freq"  # no profile: the card's base command


def test_a_custom_profile_that_unsets_the_policy_has_none(tmp_path: Path) -> None:
    """env_remove counts: the engine runs without VLLM_MOE_W2_DELTA_POLICY, so the alerts must not assume freq."""
    settings = resolve_settings(DEFAULT_RECIPE, tmp_path)
    recipe = settings.recipe
    form = dataclasses.replace(cp.form_from_profile(recipe, recipe.profile("quality")), policy="")
    profile = cp.profile_from_form(recipe, recipe.profile("quality"), "no policy", form, set())
    assert "VLLM_MOE_W2_DELTA_POLICY" in profile.env_remove
    cp.save_custom_profile(settings, profile)
    assert profile_policy(settings, profile.id) == ""
    assert ProfileRegistry(settings).find(profile.id) == profile  # the same registry the alerts read
