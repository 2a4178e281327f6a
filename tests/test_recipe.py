"""Recipe validation: both shipped recipes load; every kind of bad recipe names file, field path and expectation."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.backend.recipe import DEFAULT_RECIPE, SIMULATED_RECIPE, RecipeError, load_recipe

SIM_TEXT = SIMULATED_RECIPE.read_text()


def test_card_recipe_loads_with_the_cards_figures() -> None:
    r = load_recipe(DEFAULT_RECIPE)
    assert [p.id for p in r.profiles] == ["quality", "balanced", "speed"]
    assert r.recommended_profile.id == "quality"
    q, b, s = r.profiles
    assert (q.decode.value, b.decode.value, s.decode.value) == (48.9, 75.0, 83.2)
    assert q.quality.value == 12.27 and b.quality.value == 10.90
    assert b.delta_vs_1.mean == -1.37 and b.delta_vs_1.ci90 == (-2.48, -0.26)
    assert s.delta_vs_1.mean == -7.20 and s.delta_vs_1.ci90 == (-11.06, -3.34)
    assert r.serve.env["VLLM_MOE_W2_CKPT_ID"] == r.model.ckpt_id
    assert (r.sampling.temperature, r.sampling.top_p, r.sampling.min_p) == (1.0, 1.0, 0.05)
    assert r.context.validated_max_tokens == 262144 and r.vram.expected_gib == 93.8
    assert not r.simulated


def test_simulated_recipe_loads_and_needs_no_gpu() -> None:
    r = load_recipe(SIMULATED_RECIPE)
    assert r.simulated and r.serve.gpus == "" and r.engine.image == "moet-panel/sim-engine:1"
    assert [p.id for p in r.profiles] == ["quality", "balanced", "speed"]


def _bad(tmp_path: Path, old: str, new: str) -> RecipeError:
    assert old in SIM_TEXT, f"test edit anchor {old!r} is not in simulated.toml"
    path = tmp_path / "bad.toml"
    path.write_text(SIM_TEXT.replace(old, new, 1))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    err = info.value
    assert err.file == path and str(path) in str(err)  # every error names the file
    return err


@pytest.mark.parametrize(
    "old,new,field,expect",
    [
        pytest.param('simulated = true\n', 'simulated = true\ncolour = "red"\n', "colour", "unknown key", id="unknown-key"),
        pytest.param("port = 8000\nmounts", 'port = "eight"\nmounts', "serve.port", "valid integer", id="wrong-type"),
        pytest.param('MOET_SIM_BOOT_S = "4"', 'MOET_SIM_BOOT_S = "4"\n"bad-name" = "1"', "serve.env", "[A-Z0-9_]+", id="env-name"),
        pytest.param('VLLM_MOE_W2_DELTA_GB = "7"', 'VLLM_MOE_W2_DELTA_GB = "7\\n--privileged"', "serve.env", "single line", id="newline"),
        pytest.param(
            'env_replace = { VLLM_MOE_W2_DELTA_POLICY = "need" }',
            'env_replace = { VLLM_MOE_W2_NOT_IN_BASE = "need" }',
            "profiles[2].env_replace.VLLM_MOE_W2_NOT_IN_BASE",
            "not a base setting",
            id="replace-missing-base",
        ),
        pytest.param(
            'env_replace = { VLLM_MOE_W2_DELTA_POLICY = "need" }',
            'env_remove = ["VLLM_MOE_W2_NOT_IN_BASE"]',
            "profiles[2].env_remove.VLLM_MOE_W2_NOT_IN_BASE",
            "not a base setting",
            id="remove-missing-base",
        ),
        pytest.param('id = "speed"', 'id = "balanced"', "profiles", "duplicate profile id", id="duplicate-id"),
        pytest.param("mounts = []", 'mounts = [{ source = "../etc", target = "/x" }]', "serve.mounts[0].source",
                     "relative path", id="mount-traversal"),
        pytest.param("mounts = []", 'mounts = [{ source = "m", target = "/x/../../etc" }]', "serve.mounts[0].target",
                     "without '..'", id="mount-target-traversal"),
        pytest.param('image = "moet-panel/sim-engine:1"', 'image = "x --privileged"', "engine.image", "image reference",
                     id="image-shell-text"),
        pytest.param('[[profiles]]\nid = "speed"', '[[profiles]]\nid = "speed"\nargs_set = { "--privileged" = "", "--port" = "1" }',
                     "profiles[2].args_set", "fixed by the recipe", id="pinned-arg"),
    ],
)
def test_bad_recipe_names_field_and_expectation(tmp_path: Path, old: str, new: str, field: str, expect: str) -> None:
    err = _bad(tmp_path, old, new)
    hits = [i for i in err.issues if i.path == field]
    assert hits, f"no issue at {field!r}; got {[(i.path, i.message) for i in err.issues]}"
    assert any(expect in i.message for i in hits), [i.message for i in hits]
    assert f"{field}: " in str(err)


def test_syntax_error_and_missing_file_are_recipe_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("id = \n")
    with pytest.raises(RecipeError, match="not valid TOML"):
        load_recipe(broken)
    with pytest.raises(RecipeError, match="cannot read"):
        load_recipe(tmp_path / "absent.toml")


def test_cli_reports_bad_recipe_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from app.cli.main import main

    path = tmp_path / "bad.toml"
    path.write_text(SIM_TEXT.replace('simulated = true\n', 'simulated = true\ncolour = "red"\n'))
    assert main(["command", "--profile", "quality", "--recipe", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "colour" in err and "unknown key" in err


def test_deeply_nested_or_oversized_toml_is_a_clear_recipe_error(tmp_path: Path) -> None:
    deep = tmp_path / "deep.toml"
    deep.write_text(SIM_TEXT + "\nextra = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(RecipeError, match=r"\(size\): refused: arrays/inline tables nested more than 16 levels"):
        load_recipe(deep)
    tables = tmp_path / "tables.toml"
    tables.write_text(SIM_TEXT + "\n" + "[" + ".".join(["t"] * 40) + "]\nx = 1\n")
    with pytest.raises(RecipeError, match="tables nested more than 16 levels"):
        load_recipe(tables)
    huge = tmp_path / "huge.toml"
    huge.write_text(SIM_TEXT + "\n# " + "x" * 1_000_001 + "\n")
    with pytest.raises(RecipeError, match=r"over 1,000,000 bytes"):
        load_recipe(huge)


def test_brackets_inside_strings_and_comments_do_not_count_as_nesting(tmp_path: Path) -> None:
    from app.backend.recipe.toml_bounded import loads_bounded

    text = 'a = "' + "[" * 100 + '"\nb = \'{{{{\'\nc = """\n' + "[" * 50 + '\n"""\n# ' + "[" * 100 + "\nd = [[1], [2]]\n"
    assert loads_bounded(text)["d"] == [[1], [2]]
