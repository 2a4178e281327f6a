"""Custom profiles: clone → change knobs → the card's warnings → save/load, never with invented figures."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from app.backend import custom_profiles as cp
from app.backend.profiles import all_profiles
from app.backend.recipe import DEFAULT_RECIPE, load_recipe
from app.backend.recipe.command import build_run_spec
from app.backend.settings import resolve_settings

RECIPE = load_recipe(DEFAULT_RECIPE)


def _form(base: str, **changes: object) -> cp.EditorForm:
    return dataclasses.replace(cp.form_from_profile(RECIPE, RECIPE.profile(base)), **changes)


def _findings(base: str, **changes: object) -> set[str]:
    profile = cp.profile_from_form(RECIPE, RECIPE.profile(base), "probe", _form(base, **changes), set())
    return {f.id for f in cp.findings_for(RECIPE, profile)}


def test_card_profiles_trigger_no_warnings() -> None:
    assert all(cp.findings_for(RECIPE, p) == [] for p in RECIPE.profiles)


@pytest.mark.parametrize(
    "base,changes,expected",
    [
        ("balanced", {"promo_hyst": "4"}, {"promo-hyst-4"}),
        ("quality", {"delta_promote": "2"}, {"delta-promote-2"}),
        ("quality", {"gate": True}, {"gate-on", "gate-default-tau"}),
        ("quality", {"enforce_eager": True}, {"enforce-eager"}),
        ("quality", {"max_model_len": "294912"}, {"context-above-256k"}),
        ("quality", {"max_model_len": "262144"}, set()),
        ("speed", {"speculative": '{"method":"dspark","num_speculative_tokens":2}'}, {"speculative"}),
        ("quality", {"delta_gb": "0"}, {"no-recovery"}),
    ],
)
def test_editor_warns_from_the_cards_findings(base: str, changes: dict[str, object], expected: set[str]) -> None:
    assert _findings(base, **changes) == expected


def test_clone_keeps_base_changes_and_describes_the_difference() -> None:
    p = cp.profile_from_form(RECIPE, RECIPE.profile("balanced"), "Balanced 128K", _form("balanced", max_model_len="131072"), set())
    assert p.id == "balanced-128k" and p.based_on == "balanced" and not p.measured
    assert p.decode is None and p.quality is None and p.delta_vs_1 is None
    assert p.env_add == {"VLLM_MOE_W2_PROMO_HYST": "8"} and p.args_set == {"--max-model-len": "131072"}
    argv = build_run_spec(RECIPE, p.id, "/data/ds4", profiles=[*RECIPE.profiles, p]).argv()
    assert argv[argv.index("--max-model-len") + 1] == "131072" and argv.count("--max-model-len") == 1
    assert "PROMO_HYST=8" in p.scheduler_setting and "--max-model-len 131072" in p.scheduler_setting


def test_unsetting_a_base_arg_and_policy_swap() -> None:
    p = cp.profile_from_form(RECIPE, RECIPE.profile("quality"), "need no cap", _form("quality", policy="need", max_model_len=""), set())
    assert p.env_replace == {"VLLM_MOE_W2_DELTA_POLICY": "need"} and p.args_remove == ["--max-model-len"]
    assert "--max-model-len" not in build_run_spec(RECIPE, p.id, "/data/ds4", profiles=[p]).argv()


@pytest.mark.parametrize(
    "name,changes,match",
    [
        ("", {}, "give the profile a name"),
        ("quality", {}, "already exists"),
        ("x", {"promo_hyst": "eight"}, "whole number"),
        ("x", {"max_model_len": "256k"}, "whole number"),
        ("x", {"policy": "random"}, "freq or need"),
        ("x", {"speculative": "--privileged"}, "must not start with '-'"),
    ],
)
def test_bad_editor_input_is_a_clear_error(name: str, changes: dict[str, object], match: str) -> None:
    with pytest.raises(cp.CustomProfileError, match=match):
        cp.profile_from_form(RECIPE, RECIPE.profile("quality"), name, _form("quality", **changes), {"quality", "balanced", "speed"})


def test_save_load_delete_round_trip(tmp_path: Path) -> None:
    settings = resolve_settings(DEFAULT_RECIPE, tmp_path)
    p = cp.profile_from_form(RECIPE, RECIPE.profile("balanced"), "Hyst 4 — “quoted” \\ test", _form("balanced", promo_hyst="4"), set())
    path = cp.save_custom_profile(settings, p)
    assert path == tmp_path / ".moet-panel" / "profiles" / f"{p.id}.toml"
    data = tomllib.loads(path.read_text())
    assert data["measured"] is False and "decode" not in data and "quality" not in data
    assert cp.load_custom_profiles(settings) == [p]
    assert [q.id for q in all_profiles(settings)] == ["quality", "balanced", "speed", p.id]
    with pytest.raises(cp.CustomProfileError, match="never 'measured'"):
        cp.save_custom_profile(settings, p.model_copy(update={"measured": True}))
    assert cp.delete_custom_profile(settings, p.id) and not path.exists()
    assert cp.load_custom_profiles(settings) == []


def test_cli_command_accepts_a_saved_custom_profile(tmp_path: Path) -> None:
    from app.cli.main import main

    settings = resolve_settings(DEFAULT_RECIPE, tmp_path)
    p = cp.profile_from_form(RECIPE, RECIPE.profile("quality"), "eager test", _form("quality", enforce_eager=True), set())
    cp.save_custom_profile(settings, p)
    assert main(["command", "--profile", p.id, "--data-dir", str(tmp_path), "--format", "json"]) == 0
