"""Recipe validation: both shipped recipes load; every kind of bad recipe names file, field path and expectation;
`extends` merges a recipe over another (docs/card.md); the card's recipe is the schema's annotated example."""

from __future__ import annotations

import re
import tomllib
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, TypeAdapter

from app.backend.recipe import DEFAULT_RECIPE, SIMULATED_RECIPE, RecipeError, load_recipe
from app.backend.recipe.schema import Finding, Recipe

SIM_TEXT = SIMULATED_RECIPE.read_text()
CARD_TEXT = DEFAULT_RECIPE.read_text()


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
    assert r.simulated and r.serve.gpus == "" and r.engine.image == "moet-panel/sim-engine:2"
    assert [p.id for p in r.profiles] == ["quality", "balanced", "speed"]


def _bad(tmp_path: Path, old: str, new: str, text: str = SIM_TEXT) -> RecipeError:
    assert old in text, f"test edit anchor {old!r} is not in the recipe"
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    err = info.value
    assert err.file == path and str(path) in str(err)  # every error names the file
    return err


@pytest.mark.parametrize(
    "old,new,field,expect",
    [  # edits of simulated.toml (a copy elsewhere still finds the card it extends among the shipped recipes)
        pytest.param('simulated = true\n', 'simulated = true\ncolour = "red"\n', "colour", "unknown key", id="unknown-key"),
        pytest.param("port = 8000\nmounts", 'port = "eight"\nmounts', "serve.port", "valid integer", id="wrong-type"),
        pytest.param('MOET_SIM_BOOT_S = "4"', 'MOET_SIM_BOOT_S = "4"\n"bad-name" = "1"', "serve.env", "[A-Z0-9_]+", id="env-name"),
        pytest.param('MOET_SIM_BOOT_S = "4"', 'MOET_SIM_BOOT_S = "4\\n--privileged"', "serve.env", "single line", id="newline"),
        pytest.param("mounts = []", 'mounts = [{ source = "../etc", target = "/x" }]', "serve.mounts[0].source",
                     "relative path", id="mount-traversal"),
        pytest.param("mounts = []", 'mounts = [{ source = "m", target = "/x/../../etc" }]', "serve.mounts[0].target",
                     "without '..'", id="mount-target-traversal"),
        pytest.param('image = "moet-panel/sim-engine:2"', 'image = "x --privileged"', "engine.image", "image reference",
                     id="image-shell-text"),
    ],
)
def test_bad_recipe_names_field_and_expectation(tmp_path: Path, old: str, new: str, field: str, expect: str) -> None:
    err = _bad(tmp_path, old, new)
    _names(err, field, expect)


@pytest.mark.parametrize(
    "old,new,field,expect",
    [  # edits of the card's recipe (it extends none)
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
        pytest.param('[[profiles]]\nid = "speed"', '[[profiles]]\nid = "speed"\nargs_set = { "--privileged" = "", "--port" = "1" }',
                     "profiles[2].args_set", "fixed by the recipe", id="pinned-arg"),
    ],
)
def test_bad_card_recipe_names_field_and_expectation(tmp_path: Path, old: str, new: str, field: str,
                                                      expect: str) -> None:
    _names(_bad(tmp_path, old, new, CARD_TEXT), field, expect)


def _names(err: RecipeError, field: str, expect: str) -> None:
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


# --- extends ---------------------------------------------------------------------------------------------


def _dump(items: list[Finding]) -> dict[str, object]:
    return {i.id: i.model_dump() for i in items}


def test_every_finding_of_the_card_reaches_the_simulated_recipe() -> None:
    card, sim = load_recipe(DEFAULT_RECIPE), load_recipe(SIMULATED_RECIPE)
    assert len(card.findings) == 22
    assert _dump(list(card.findings)) == _dump(list(sim.findings))  # ids, conditions, severities and words
    # what the card shares with demo mode arrives unchanged; what the simulated recipe writes replaces it
    assert sim.profiles == card.profiles and sim.studies == card.studies and sim.why == card.why
    assert sim.sampling == card.sampling and sim.context == card.context and sim.regenerate == card.regenerate
    assert sim.serve.env == {**card.serve.env, "MOET_SIM_BOOT_S": "4"}  # a table merges key by key
    assert [a.id for a in sim.artifacts] == ["planescache"]  # a list replaces the card's
    assert "--trust-remote-code" in card.serve.args and "--trust-remote-code" not in sim.serve.args
    assert sim.pins == {} and sim.engine.build_env == {} and card.pins  # an empty table clears the card's
    assert sim.engine.commit == card.engine.commit and sim.engine.image != card.engine.image


def test_no_built_in_profile_of_the_simulated_recipe_trips_a_card_warning() -> None:
    from app.backend.custom_profiles import findings_for

    sim, card = load_recipe(SIMULATED_RECIPE), load_recipe(DEFAULT_RECIPE)
    for p in sim.profiles:  # the card's own command trips none either: demo mode shows the card's picture
        assert [f.id for f in findings_for(sim, p)] == [f.id for f in findings_for(card, card.profile(p.id))] == []


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_derived_recipe_can_change_or_add_findings_but_never_drops_the_bases(tmp_path: Path) -> None:
    base = _write(tmp_path / "base.toml", CARD_TEXT)
    derived = _write(tmp_path / "derived.toml", 'extends = "base.toml"\nid = "derived"\n'
                     '[[findings]]\nid = "pool-10gib"\nseverity = "warn"\n'
                     '[[findings]]\nid = "my-own"\nwhen = [{ arg = "--enforce-eager", absent = false }]\nmessage = "no"\n')
    card, got = load_recipe(base), load_recipe(derived)
    assert got.id == "derived" and [f.id for f in got.findings] == [f.id for f in card.findings] + ["my-own"]
    changed = next(f for f in got.findings if f.id == "pool-10gib")
    before = next(f for f in card.findings if f.id == "pool-10gib")
    assert changed.severity == "warn" and before.severity == "error" and changed.message == before.message


def test_a_recipe_in_another_folder_extends_by_relative_path(tmp_path: Path) -> None:
    (tmp_path / "cards").mkdir()
    _write(tmp_path / "cards" / "mine.toml", CARD_TEXT.replace('id = "ds4-flash-0731-sm120"', 'id = "mine"', 1))
    derived = _write(tmp_path / "d.toml", 'extends = "cards/mine.toml"\ntitle = "over"\n')
    r = load_recipe(derived)
    assert (r.id, r.title) == ("mine", "over")


def test_extends_loops_and_missing_bases_are_clear_errors(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.toml", 'extends = "b.toml"\nid = "a"\n')
    _write(tmp_path / "b.toml", 'extends = "a.toml"\nid = "b"\n')
    with pytest.raises(RecipeError) as info:
        load_recipe(a)
    assert info.value.file == a and info.value.issues[0].path == "extends"
    assert "loop: a.toml → b.toml → a.toml" in str(info.value)
    self_ref = _write(tmp_path / "self.toml", 'extends = "self.toml"\n')
    with pytest.raises(RecipeError, match="loop: self.toml → self.toml"):
        load_recipe(self_ref)
    missing = _write(tmp_path / "m.toml", 'extends = "nowhere.toml"\n')
    with pytest.raises(RecipeError, match=r"m\.toml: extends: no recipe at .*nowhere\.toml"):
        load_recipe(missing)
    wrong = _write(tmp_path / "w.toml", "extends = 3\n")
    with pytest.raises(RecipeError, match="extends: expected the file name of another recipe"):
        load_recipe(wrong)


def test_an_error_names_the_file_that_set_the_field(tmp_path: Path) -> None:
    base = _write(tmp_path / "base.toml", CARD_TEXT.replace("stop_grace_s = 90", 'stop_grace_s = "soon"', 1))
    derived = _write(tmp_path / "derived.toml", 'extends = "base.toml"\n[serve]\nport = "x"\n')
    with pytest.raises(RecipeError) as info:
        load_recipe(derived)
    err = info.value
    by_path = {i.path: i for i in err.issues}
    assert by_path["engine.stop_grace_s"].file == base and by_path["serve.port"].file is None
    assert f"{base}: engine.stop_grace_s: " in str(err) and f"{derived}: serve.port: " in str(err)
    assert str(derived) in str(err).splitlines()[0]  # the file loaded is named first
    broken = _write(tmp_path / "broken.toml", "id = \n")
    via = _write(tmp_path / "via.toml", 'extends = "broken.toml"\n')
    with pytest.raises(RecipeError) as info:
        load_recipe(via)
    assert info.value.file == via and info.value.issues[0].file == broken and "not valid TOML" in str(info.value)


# --- the annotated example ---------------------------------------------------------------------------------

_NOTE_RE = re.compile(r"^#\s*([a-z_]+) = (.+)$")
_HEADER_RE = re.compile(r"^\[\[?([a-z_.]+)\]\]?\s*(#.*)?$")


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def _fields_set(model: type[BaseModel], value: object) -> Iterator[tuple[str, str]]:
    """(model name, field) for every key the data sets, through nested tables and arrays of tables."""
    if isinstance(value, list):
        for v in value:
            yield from _fields_set(model, v)
        return
    if not isinstance(value, dict):
        return
    for key, v in value.items():
        yield model.__name__, key
        field = model.model_fields.get(key)
        for sub in _models(field.annotation) if field else []:
            yield from _fields_set(sub, v)


def _schema_fields(model: type[BaseModel], seen: set[str] | None = None) -> Iterator[tuple[str, str]]:
    seen = set() if seen is None else seen
    if model.__name__ in seen:
        return
    seen.add(model.__name__)
    for name, field in model.model_fields.items():
        yield model.__name__, name
        for sub in _models(field.annotation):
            yield from _schema_fields(sub, seen)


def _table_model(header: str) -> type[BaseModel] | None:
    model: type[BaseModel] = Recipe
    for part in header.split("."):
        field = model.model_fields.get(part)
        subs = _models(field.annotation) if field else []
        if not subs:
            return None  # a table of free keys (serve.env, why, pins)
        model = subs[0]
    return model


def test_the_card_recipe_annotates_every_field_of_the_schema() -> None:
    """Each field is set in the card's recipe or shown as `# key = value` in its table, with a valid value."""
    documented = set(_fields_set(Recipe, tomllib.loads(CARD_TEXT)))
    model: type[BaseModel] | None = Recipe
    for line in CARD_TEXT.splitlines():
        if (h := _HEADER_RE.match(line)) is not None:
            model = _table_model(h.group(1))
        elif (n := _NOTE_RE.match(line)) is not None and model is not None:
            key, value = n.group(1), tomllib.loads(f"{n.group(1)} = {n.group(2)}")[n.group(1)]
            if model is Recipe and key == "extends":
                assert isinstance(value, str)
                continue
            assert key in model.model_fields, f"annotation {line!r} names no field of {model.__name__}"
            TypeAdapter(model.model_fields[key].annotation).validate_python(value)
            documented.add((model.__name__, key))
    missing = sorted(f"{m}.{f}" for m, f in set(_schema_fields(Recipe)) - documented)
    assert missing == [], "fields of schema.py neither set nor annotated in the card's recipe"
