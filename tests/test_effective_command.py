"""The one reading of an engine command (app/backend/recipe/effective.py): has / value / set / remove."""

from __future__ import annotations

from app.backend.recipe import DEFAULT_RECIPE, load_recipe
from app.backend.recipe.effective import EffectiveCommand, arg_items

CMD = EffectiveCommand.of({"A": "1", "B": "2"}, ["serve", "--x", "5", "--bare", "--y", "-1"])


def test_args_group_a_flag_with_the_token_after_it() -> None:
    assert arg_items(CMD.args) == (("serve", None), ("--x", "5"), ("--bare", None), ("--y", "-1"))
    assert CMD.has_arg("--bare") and CMD.arg_value("--bare") is None
    assert CMD.arg_value("--x") == "5" and CMD.arg_value("--y") == "-1"
    assert not CMD.has_arg("--z") and CMD.arg_value("--z") is None


def test_set_replaces_in_place_or_appends_and_remove_drops_the_value() -> None:
    assert CMD.set_arg("--x", "6").args == ("serve", "--x", "6", "--bare", "--y", "-1")
    assert CMD.set_arg("--x").args == ("serve", "--x", "--bare", "--y", "-1")
    assert CMD.set_arg("--z", "1").args[-2:] == ("--z", "1")
    assert CMD.remove_arg("--x").args == ("serve", "--bare", "--y", "-1")
    assert CMD.remove_arg("--bare").args == ("serve", "--x", "5", "--y", "-1")


def test_env_keeps_the_card_order() -> None:
    assert CMD.set_env("A", "9").env == (("A", "9"), ("B", "2"))
    assert CMD.set_env("C", "3").env[-1] == ("C", "3")
    assert CMD.remove_env("A").env == (("B", "2"),) and not CMD.remove_env("A").has_env("A")
    assert CMD.env_value("B") == "2" and CMD.env_value("Z") is None


def test_a_profile_command_is_the_base_with_its_changes() -> None:
    recipe = load_recipe(DEFAULT_RECIPE)
    speed = recipe.command(recipe.profile("speed"))
    assert speed.env_value("VLLM_MOE_W2_DELTA_POLICY") == "need"
    assert [k for k, _ in speed.env][: len(recipe.serve.env)] == list(recipe.serve.env)  # replaced in place
    assert recipe.command(recipe.profile("quality")) == recipe.serve.command
