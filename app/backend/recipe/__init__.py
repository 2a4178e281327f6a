"""Recipes: the model card's facts as validated data."""

from app.backend.recipe.loader import DEFAULT_RECIPE, SIMULATED_RECIPE, RecipeError, load_recipe
from app.backend.recipe.schema import ProfileSpec, Recipe

__all__ = ["DEFAULT_RECIPE", "SIMULATED_RECIPE", "ProfileSpec", "Recipe", "RecipeError", "load_recipe"]
