"""Recipe and custom-profile values never become extra docker options or shell text."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import pytest
import tomli_w
from pydantic import ValidationError

from app.backend.profiles import custom as cp
from app.backend.recipe import SIMULATED_RECIPE, load_recipe
from app.backend.recipe.command import CommandError, build_run_spec, render_shell
from app.backend.recipe.schema import Mount, ProfileSpec
from app.backend.config.settings import resolve_settings

RECIPE = load_recipe(SIMULATED_RECIPE)
HOSTILE = ["1; rm -rf /", "--privileged", "x --privileged", "$(id)", "`id`", "a' -v /:/host '", "-v=/:/host", "1 && curl x|sh"]


def _docker_part(argv: list[str], image: str) -> list[str]:
    return argv[: argv.index(image)]


def _with_env(value: str):
    env = {**RECIPE.serve.env, "VLLM_MOE_W2_DELTA_GB": value}
    return RECIPE.model_copy(update={"serve": RECIPE.serve.model_copy(update={"env": env})})


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_env_value_is_one_argv_element_and_round_trips_through_the_shell(value: str) -> None:
    recipe = _with_env(value)
    spec = build_run_spec(recipe, "quality", "/data/ds4")
    argv = spec.argv()
    docker = _docker_part(argv, spec.image)
    assert f"VLLM_MOE_W2_DELTA_GB={value}" in docker
    assert docker[docker.index(f"VLLM_MOE_W2_DELTA_GB={value}") - 1] == "-e"
    assert "--privileged" not in docker and "/:/host" not in docker
    expected_len = (3 + 2 + 2 * (len(spec.labels) + len(spec.mounts) + len(spec.env))
                    + 2 * (bool(spec.network) + bool(spec.gpus) + bool(spec.ipc) + bool(spec.shm_size)))
    assert len(docker) == expected_len
    text = render_shell(spec)
    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith("#")).replace("\\\n", " ")
    assert shlex.split(body) == argv  # the displayed shell text parses back to exactly the argv


@pytest.mark.parametrize("value", ["7\n--privileged", "7\r-v /:/host", "7\x00", "a\tb"])
def test_control_characters_are_rejected_by_the_schema(value: str) -> None:
    with pytest.raises(ValidationError, match="single line"):
        RECIPE.serve.model_validate({**RECIPE.serve.model_dump(), "env": {"VLLM_MOE_W2_DELTA_GB": value}})


@pytest.mark.parametrize("name", ["A=B", "lower", "X Y", "--privileged", "X;Y", "", "X\nY"])
def test_bad_env_names_are_rejected(name: str) -> None:
    with pytest.raises(ValidationError, match=r"\[A-Z0-9_\]\+"):
        ProfileSpec(id="p", number=1, title="t", summary="s", scheduler_setting="x", env_add={name: "1"})
    with pytest.raises(CommandError):
        build_run_spec(RECIPE, "quality", "/data/ds4", extra_env={name: "1"})


@pytest.mark.parametrize("source", ["../etc", "a/../../etc", "/etc", "", ".", "x:/host", "a,b", "x\n-v"])
def test_mount_source_traversal_is_rejected(source: str) -> None:
    with pytest.raises(ValidationError):
        Mount(source=source, target="/m")


@pytest.mark.parametrize("target", ["relative", "/a/../../etc", "/m:rw", "/a,b", "/m\n--privileged"])
def test_mount_target_is_checked(target: str) -> None:
    with pytest.raises(ValidationError):
        Mount(source="m", target=target)


@pytest.mark.parametrize("data_dir", ["/data/../etc", "relative/dir", "/data:/host", "/a,b", "/data\n--privileged"])
def test_unsafe_data_dir_is_rejected(data_dir: str) -> None:
    with pytest.raises(CommandError):
        build_run_spec(RECIPE, "quality", data_dir)


def test_engine_arg_values_cannot_start_a_new_option() -> None:
    with pytest.raises(ValidationError, match="must not start with '-'"):
        ProfileSpec(id="p", number=1, title="t", summary="s", scheduler_setting="x", args_set={"--max-model-len": "--privileged"})
    with pytest.raises(ValidationError, match="--lower-case-name"):
        ProfileSpec(id="p", number=1, title="t", summary="s", scheduler_setting="x", args_set={"-v": "/:/host"})


@pytest.fixture
def settings(tmp_path: Path):
    return resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)


@pytest.mark.parametrize("value", HOSTILE)
def test_custom_profile_hostile_values_stay_single_elements(settings, value: str) -> None:
    base = RECIPE.profile("balanced")
    form = cp.EditorForm(**{**cp.form_from_profile(RECIPE, base).__dict__, "extra_env": f"VLLM_MOE_W2_NOTE={value}",
                            "speculative": '{"method":"ngram"} ' + value})
    profile = cp.profile_from_form(RECIPE, base, "hostile", form, set())
    cp.save_custom_profile(settings, profile)
    loaded = cp.load_custom_profiles(settings)
    assert [p.id for p in loaded] == ["hostile"]
    spec = build_run_spec(RECIPE, "hostile", str(settings.data_dir), profiles=list(RECIPE.profiles) + loaded)
    argv = spec.argv()
    docker = _docker_part(argv, spec.image)
    assert f"VLLM_MOE_W2_NOTE={value}" in docker and "--privileged" not in docker
    engine = argv[argv.index(spec.image) + 1 :]
    assert engine[engine.index("--speculative-config") + 1] == '{"method":"ngram"} ' + value


@pytest.mark.parametrize(
    "extra,match",
    [
        ("LD_PRELOAD=/tmp/x.so", "may only set variables starting with"),
        ("VLLM_MOE_W2_CKPT_ID=deadbeef", "ties the container"),
        ("-VLLM_MOE_W2_STORE_DIR", "ties the container"),
        ("bad name=1", r"\[A-Z0-9_\]\+"),
        ("JUSTTEXT", "expected NAME=value"),
    ],
)
def test_custom_profile_env_rules(extra: str, match: str) -> None:
    base = RECIPE.profile("quality")
    form = cp.EditorForm(**{**cp.form_from_profile(RECIPE, base).__dict__, "extra_env": extra})
    with pytest.raises(cp.CustomProfileError, match=match):
        cp.profile_from_form(RECIPE, base, "x", form, set())


def test_tampered_custom_profile_files_are_skipped_with_a_reason(settings) -> None:
    folder = cp.profiles_dir(settings)
    folder.mkdir(parents=True)
    quality = RECIPE.profile("quality")
    good = cp.profile_from_form(RECIPE, quality, "ok", cp.form_from_profile(RECIPE, quality), set())
    cp.save_custom_profile(settings, good)
    saved = tomllib.loads((folder / "ok.toml").read_text())

    def variant(name: str, **changes: object) -> None:  # the saved file, edited by hand
        (folder / f"{name}.toml").write_text(tomli_w.dumps({**saved, "id": name, **changes}))

    variant("preload", env_add={"LD_PRELOAD": "/x.so"})
    variant("newline", env_add={"VLLM_X": "a\n--privileged"})
    variant("eager", args_set={"--privileged": ""})
    variant("measured", measured=True)
    variant("quality")  # shadowing a card profile
    report = cp.load_custom_profiles_report(settings)
    assert [p.id for p in report.profiles] == ["ok"]
    assert len(report.problems) == 5, report.problems
    assert not cp.delete_custom_profile(settings, "../../etc/passwd")


# --- issue 13 item 4: inputs bounded and typed ---------------------------------------------------

def _extra(extra: str, *, expert: bool = False, **changes: str):
    base = RECIPE.profile("quality")
    form = cp.EditorForm(**{**cp.form_from_profile(RECIPE, base).__dict__, "extra_env": extra, "expert": expert, **changes})
    return cp.profile_from_form(RECIPE, base, "x", form, set())


def test_a_one_megabyte_value_is_refused_with_its_size() -> None:
    with pytest.raises(cp.CustomProfileError, match=r"env VLLM_MOE_W2_NOTE: value is 1,048,576 characters; the limit is 1,024"):
        _extra("VLLM_MOE_W2_NOTE=" + "a" * 2**20)
    with pytest.raises(cp.CustomProfileError, match=r"--speculative-config: value is 1,048,576 characters"):
        _extra("", speculative="{" + "a" * (2**20 - 1))
    with pytest.raises(cp.CustomProfileError, match="limit is 80"):
        cp.profile_from_form(RECIPE, RECIPE.profile("quality"), "n" * 81, cp.form_from_profile(RECIPE, RECIPE.profile("quality")), set())
    assert _extra("VLLM_MOE_W2_NOTE=" + "a" * 1024).env_add["VLLM_MOE_W2_NOTE"] == "a" * 1024


@pytest.mark.parametrize("char", ["\u009b", "\u202e", "\u2066", "\u200b", "\u2028", "\u2029", "\u0085", "\ufeff", "\ue000"])
def test_unicode_control_and_format_characters_are_refused_by_name(char: str) -> None:
    with pytest.raises(cp.CustomProfileError, match=f"U\\+{ord(char):04X}"):
        _extra(f"VLLM_MOE_W2_NOTE=a{char}b")
    with pytest.raises(cp.CustomProfileError, match=f"U\\+{ord(char):04X}"):
        _extra("", speculative=f'{{"method":"ngram"{char}}}')
    with pytest.raises(cp.CustomProfileError, match=f"U\\+{ord(char):04X}"):
        quality = RECIPE.profile("quality")
        cp.profile_from_form(RECIPE, quality, f"name{char}x", cp.form_from_profile(RECIPE, quality), set())
    with pytest.raises(ValidationError, match=f"U\\+{ord(char):04X}"):
        RECIPE.serve.model_validate({**RECIPE.serve.model_dump(), "env": {"VLLM_MOE_W2_DELTA_GB": f"7{char}"}})


def test_printable_unicode_is_still_accepted() -> None:
    assert _extra("VLLM_MOE_W2_NOTE=naïve — ≈ ⭐ 日本").env_add["VLLM_MOE_W2_NOTE"] == "naïve — ≈ ⭐ 日本"


@pytest.mark.parametrize("digits", ["²", "٢٥٦", "１２", "2²", "²⁵⁶", "12\u0663"])
def test_numeric_args_and_env_take_ascii_digits_only(digits: str) -> None:
    assert digits.isdigit()  # what the old check accepted
    with pytest.raises(cp.CustomProfileError, match="ASCII digits"):
        _extra("", max_model_len=digits)
    with pytest.raises(cp.CustomProfileError, match="ASCII digits"):
        _extra("", max_num_seqs=digits)
    with pytest.raises(cp.CustomProfileError, match="ASCII digits"):
        _extra("", delta_gb=digits)


def test_long_ids_sharing_a_prefix_get_different_container_names() -> None:
    from app.backend.recipe.command import managed_container_name
    from app.backend.recipe.schema import CONTAINER_NAME_RE

    recipe = RECIPE.model_copy(update={"id": "a-long-recipe-identifier-for-names"})
    a = ProfileSpec(id="x" * 40 + "-one", number=100, title="a", summary="a", scheduler_setting="a", measured=False)
    b = a.model_copy(update={"id": "x" * 40 + "-two"})
    na, nb = managed_container_name(recipe, a), managed_container_name(recipe, b)
    assert na != nb and len(na) <= 63 and len(nb) <= 63
    assert CONTAINER_NAME_RE.fullmatch(na) and CONTAINER_NAME_RE.fullmatch(nb)
    assert managed_container_name(RECIPE, RECIPE.profile("quality")) == "moet-simulated-quality"  # short names unchanged


@pytest.mark.parametrize("name", sorted(cp.EXPERT_ENV))
def test_expert_env_needs_the_expert_option_and_names_the_risk(name: str) -> None:
    with pytest.raises(cp.CustomProfileError, match=f"env {name} is an expert setting: it .*Tick the expert option"):
        _extra(f"{name}=1")
    p = _extra(f"{name}=1", expert=True)
    assert p.expert and p.env_add == {name: "1"}
    risks = cp.expert_risks(p)
    assert risks == [f"{name} {cp.EXPERT_ENV[name]}."]


def test_dev_mode_and_insecure_serialization_are_on_the_expert_list() -> None:
    assert {"VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_INSECURE_SERIALIZATION"} <= set(cp.EXPERT_ENV)


def test_a_hand_edited_file_cannot_set_an_expert_env_without_the_flag(settings) -> None:
    p = _extra("VLLM_SERVER_DEV_MODE=1", expert=True)
    path = cp.save_custom_profile(settings, p)
    assert [q.id for q in cp.load_custom_profiles(settings)] == ["x"]
    path.write_text(path.read_text().replace("expert = true", "expert = false"))
    report = cp.load_custom_profiles_report(settings)
    assert report.profiles == [] and "expert setting" in report.problems[0]


def test_deep_or_huge_custom_profile_files_are_skipped_with_a_reason(settings) -> None:
    folder = cp.profiles_dir(settings)
    folder.mkdir(parents=True)
    (folder / "deep.toml").write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    (folder / "deeptable.toml").write_text("x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n")
    (folder / "huge.toml").write_text('id = "huge"\nsummary = "' + "a" * 100_000 + '"\n')
    report = cp.load_custom_profiles_report(settings)
    assert report.profiles == []
    by_file = {pr.split(":")[0]: pr for pr in report.problems}
    assert "nested more than" in by_file["skipped deep.toml"] and "nested more than" in by_file["skipped deeptable.toml"]
    assert "over 65,536 bytes" in by_file["skipped huge.toml"]
