"""Recipe and custom-profile values never become extra docker options or shell text."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.backend import custom_profiles as cp
from app.backend.recipe import SIMULATED_RECIPE, load_recipe
from app.backend.recipe.command import CommandError, build_run_spec, render_shell
from app.backend.recipe.schema import Mount, ProfileSpec
from app.backend.settings import resolve_settings

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
    expected_len = 3 + 2 + 2 * (len(spec.labels) + len(spec.mounts) + len(spec.env)) + 2 * bool(spec.network) + 2 * bool(spec.gpus) + 2 * bool(spec.ipc) + 2 * bool(spec.shm_size)
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
    form = cp.EditorForm(**{**cp.form_from_profile(RECIPE, base).__dict__, "extra_env": f"VLLM_MOE_W2_NOTE={value}", "speculative": '{"method":"ngram"} ' + value})
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
    good = cp.profile_from_form(RECIPE, RECIPE.profile("quality"), "ok", cp.form_from_profile(RECIPE, RECIPE.profile("quality")), set())
    cp.save_custom_profile(settings, good)
    text = (folder / "ok.toml").read_text()
    (folder / "preload.toml").write_text(text.replace('id = "ok"', 'id = "preload"').replace("env_add = {  }", 'env_add = { "LD_PRELOAD" = "/x.so" }'))
    (folder / "newline.toml").write_text(text.replace('id = "ok"', 'id = "newline"').replace("env_add = {  }", 'env_add = { "VLLM_X" = "a\\n--privileged" }'))
    (folder / "eager.toml").write_text(text.replace('id = "ok"', 'id = "eager"').replace("args_set = {  }", 'args_set = { "--privileged" = "" }'))
    (folder / "measured.toml").write_text(text.replace('id = "ok"', 'id = "measured"').replace("measured = false", "measured = true"))
    (folder / "quality.toml").write_text(text.replace('id = "ok"', 'id = "quality"'))  # shadowing a card profile
    report = cp.load_custom_profiles_report(settings)
    assert [p.id for p in report.profiles] == ["ok"]
    assert len(report.problems) == 5, report.problems
    assert not cp.delete_custom_profile(settings, "../../etc/passwd")
