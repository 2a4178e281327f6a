"""Custom profiles: clone → change knobs → the card's warnings → save/load, never with invented figures."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from app.backend.profiles import custom as cp
from app.backend.profiles.registry import all_profiles
from app.backend.recipe import DEFAULT_RECIPE, load_recipe
from app.backend.recipe.command import build_run_spec
from app.backend.config.settings import resolve_settings

RECIPE = load_recipe(DEFAULT_RECIPE)


def _form(base: str, **changes: object) -> cp.EditorForm:
    return dataclasses.replace(cp.form_from_profile(RECIPE, RECIPE.profile(base)), **changes)


def _findings(base: str, **changes: object) -> set[str]:
    profile = cp.profile_from_form(RECIPE, RECIPE.profile(base), "probe", _form(base, **changes), set())
    return {f.id for f in cp.findings_for(RECIPE, profile)}


def test_card_profiles_trigger_no_warnings() -> None:
    assert all(cp.findings_for(RECIPE, p) == [] for p in RECIPE.profiles)


GATE_EXPLICIT = "VLLM_MOE_W2_GATE_TAU=0.15\nVLLM_MOE_W2_GATE_FP_MAX=1"
DSPARK = '{"method":"dspark","num_speculative_tokens":2}'
NGRAM = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4}'
# finding id -> (a change that must raise it, a neighbouring change that must not), on profile 1's command
FINDING_CASES: dict[str, tuple[dict[str, object], dict[str, object]]] = {
    "promo-hyst-4": ({"promo_hyst": "4"}, {"promo_hyst": "8"}),
    "promo-hyst-above-8": ({"promo_hyst": "16"}, {"promo_hyst": "8"}),
    "delta-promote-2": ({"delta_promote": "2"}, {"delta_promote": "3"}),
    "gate-on": ({"gate": True, "extra_env": GATE_EXPLICIT}, {"gate": False, "extra_env": GATE_EXPLICIT}),
    "gate-defaults": ({"gate": True, "extra_env": "VLLM_MOE_W2_GATE_FP_MAX=1"}, {"gate": True, "extra_env": GATE_EXPLICIT}),
    "gate-default-freq-trap": ({"gate": True}, {"gate": True, "policy": "need"}),
    "enforce-eager": ({"enforce_eager": True}, {"enforce_eager": False, "max_model_len": "131072"}),
    "context-above-256k": ({"max_model_len": "294912"}, {"max_model_len": "262144"}),
    "context-unbounded": ({"max_model_len": ""}, {"max_model_len": "131072"}),
    "max-num-seqs": ({"max_num_seqs": "4"}, {"max_num_seqs": "1"}),
    "speculative-dspark": ({"speculative": DSPARK}, {"speculative": NGRAM}),
    "speculative-mtp": ({"speculative": '{"method":"deepseek_mtp","num_speculative_tokens":1}'}, {"speculative": NGRAM}),
    "speculative-ngram": ({"speculative": NGRAM}, {"speculative": DSPARK}),
    "speculative-other": ({"speculative": '{"method":"eagle","model":"x"}'}, {"speculative": NGRAM}),
    "no-recovery": ({"delta_gb": "0"}, {"delta_gb": "0", "gate": True}),
    "pool-below-7": ({"delta_gb": "6"}, {"delta_gb": "7"}),
    "pool-above-7": ({"delta_gb": "9"}, {"delta_gb": "10"}),
    "pool-10gib": ({"delta_gb": "10"}, {"delta_gb": "9"}),
    "force-valves-removed": ({"extra_env": "-VLLM_MOE_W2_FORCE_POOL"}, {"extra_env": "VLLM_MOE_W2_FORCE_POOL=1"}),
    "alloc-conf-removed": ({"extra_env": "-PYTORCH_CUDA_ALLOC_CONF"},
                           {"extra_env": "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,garbage_collection_threshold:0.8"}),
    "breakable-cudagraph": ({"extra_env": "-VLLM_USE_BREAKABLE_CUDAGRAPH"}, {"extra_env": "VLLM_USE_BREAKABLE_CUDAGRAPH=0"}),
    "estimate-cudagraphs": ({"extra_env": "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1"},
                            {"extra_env": "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0"}),
}


def test_every_finding_of_the_recipe_has_a_positive_and_a_negative_case() -> None:
    assert sorted(FINDING_CASES) == sorted(f.id for f in RECIPE.findings)


@pytest.mark.parametrize("fid", sorted(FINDING_CASES))
def test_each_finding_fires_on_its_condition_and_not_on_the_neighbouring_one(fid: str) -> None:
    positive, negative = FINDING_CASES[fid]
    assert fid in _findings("quality", **positive)
    assert fid not in _findings("quality", **negative)


def test_no_recovery_also_means_the_delta_kill_switch() -> None:
    assert "no-recovery" in _findings("quality", extra_env="VLLM_MOE_W2_DELTA=0")
    assert "no-recovery" not in _findings("quality", extra_env="VLLM_MOE_W2_DELTA=1")


def test_legacy_one_test_findings_still_load_and_match() -> None:
    from app.backend.recipe.effective import EffectiveCommand
    from app.backend.recipe.schema import Finding

    old = Finding(id="x", kind="arg_value_above", key="--max-model-len", value="262144", message="m")
    assert old.applies(EffectiveCommand.of({}, ["--max-model-len", "294912"]))
    assert not old.applies(EffectiveCommand.of({}, ["--max-model-len", "262144"]))
    assert Finding(id="y", kind="env_equals", key="A", value="1", message="m").applies(EffectiveCommand.of({"A": "1"}, []))


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


def test_simulated_card_profiles_trigger_no_warnings_either() -> None:
    from app.backend.recipe import SIMULATED_RECIPE

    sim = load_recipe(SIMULATED_RECIPE)
    assert all(cp.findings_for(sim, p) == [] for p in sim.profiles)
