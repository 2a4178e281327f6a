"""Custom profiles: clone a recipe profile, change knobs inside the schema, save it in the data dir.

A custom profile is a `ProfileSpec` like the recipe's (same validation, same `build_run_spec`), stored as
`<state_dir>/profiles/<id>.toml` with `measured = false` and no figures: the panel never invents numbers
for a configuration nobody measured. What a user may change is deliberately narrow:
env variables with a known prefix (not the cache/identity pins) and a short whitelist of engine args,
the ones the card has findings about.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from app.backend.recipe.command import profile_args, profile_env
from app.backend.recipe.schema import ENV_NAME_RE, Finding, ProfileSpec, Recipe
from app.backend.settings import Settings

PROFILES_SUBDIR = "profiles"
ENV_PREFIXES = ("VLLM_", "PYTORCH_", "MOET_SIM_")
# Tied to the mounts and the cache identity: changing them breaks the cache instead of tuning it.
PROTECTED_ENV = frozenset({"VLLM_MOE_W2_CKPT_ID", "VLLM_MOE_W2_PLANES_CACHE", "VLLM_MOE_W2_STORE_DIR", "VLLM_MOE_W2"})
# Engine args a custom profile may set: name -> takes a value (False = bare flag).
ARG_WHITELIST: dict[str, bool] = {
    "--max-model-len": True,
    "--max-num-seqs": True,
    "--enforce-eager": False,
    "--speculative-config": True,
}
_NUMERIC_ARGS = frozenset({"--max-model-len", "--max-num-seqs"})


class CustomProfileError(ValueError):
    """A custom profile cannot be built or saved; the message says what to change."""


@dataclass(frozen=True)
class Knobs:
    """The editor's view of a profile: effective env and the whitelisted args (None = absent)."""

    env: dict[str, str]
    args: dict[str, str | None]


@dataclass(frozen=True)
class LoadReport:
    profiles: list[ProfileSpec] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one sentence per unreadable/invalid file


def profiles_dir(settings: Settings) -> Path:
    return settings.state_dir / PROFILES_SUBDIR


def slugify(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.strip().lower()).strip("-")[:40]
    return slug


def knobs_of(recipe: Recipe, profile: ProfileSpec) -> Knobs:
    return Knobs(env=dict(profile_env(recipe, profile)), args=_whitelisted_args(profile_args(recipe, profile)))


def _whitelisted_args(argv: list[str]) -> dict[str, str | None]:
    args: dict[str, str | None] = {}
    for flag, takes_value in ARG_WHITELIST.items():
        if flag not in argv:
            args[flag] = None
            continue
        i = argv.index(flag)
        args[flag] = argv[i + 1] if takes_value and i + 1 < len(argv) else ""
    return args


def _check_env_change(name: str, value: str | None) -> None:
    if not ENV_NAME_RE.fullmatch(name):
        raise CustomProfileError(f"env name {name!r} must match [A-Z0-9_]+")
    if not name.startswith(ENV_PREFIXES):
        raise CustomProfileError(f"env {name}: custom profiles may only set variables starting with {', '.join(ENV_PREFIXES)}")
    if name in PROTECTED_ENV:
        raise CustomProfileError(f"env {name} ties the container to the downloaded cache; a custom profile cannot change it")
    if value is not None and re.search(r"[\x00-\x1f\x7f]", value):
        raise CustomProfileError(f"env {name}: value must be a single line without control characters")


def _check_arg(flag: str, value: str | None) -> None:
    if flag not in ARG_WHITELIST:
        raise CustomProfileError(f"engine argument {flag} cannot be changed here (allowed: {', '.join(ARG_WHITELIST)})")
    if value is None or not ARG_WHITELIST[flag]:
        return
    if not value.strip():
        raise CustomProfileError(f"{flag} needs a value (or leave it unset)")
    if flag in _NUMERIC_ARGS and not value.isdigit():
        raise CustomProfileError(f"{flag} must be a whole number, got {value!r}")


def make_custom_profile(
    recipe: Recipe,
    base: ProfileSpec,
    name: str,
    env: dict[str, str],
    args: dict[str, str | None],
    taken_ids: set[str],
) -> ProfileSpec:
    """Express the wanted effective env/args as changes to the recipe's base command.

    Raises:
        CustomProfileError: bad name, id clash, disallowed env/arg, or a schema violation.
    """
    title = " ".join(name.split())
    pid = slugify(title)
    if not pid or not title:
        raise CustomProfileError("give the profile a name (letters or digits)")
    if pid in taken_ids:
        raise CustomProfileError(f"a profile with id {pid!r} already exists; pick another name")
    base_env = dict(recipe.serve.env)
    current = knobs_of(recipe, base)
    for k in set(base_env) | set(env) | set(current.env):
        if env.get(k) != current.env.get(k):
            _check_env_change(k, env.get(k))
    env_replace = {k: v for k, v in env.items() if k in base_env and v != base_env[k]}
    env_remove = [k for k in base_env if k not in env]
    env_add = {k: v for k, v in env.items() if k not in base_env}
    base_args = _whitelisted_args(list(recipe.serve.args))
    args_set: dict[str, str] = {}
    args_remove: list[str] = []
    for flag, value in args.items():
        _check_arg(flag, value)
        if value == base_args.get(flag):
            continue
        if value is None:
            args_remove.append(flag)
        else:
            args_set[flag] = value if ARG_WHITELIST[flag] else ""
    number = max([p.number for p in recipe.profiles] + [99]) + 1
    try:
        return ProfileSpec(
            id=pid,
            number=number,
            title=title,
            summary=f"Custom — {title} (cloned from {base.id}; not measured)",
            scheduler_setting=_describe(env_add, env_replace, env_remove, args_set, args_remove),
            env_add=env_add,
            env_replace=env_replace,
            env_remove=env_remove,
            args_set=args_set,
            args_remove=args_remove,
            measured=False,
            based_on=base.id,
            notes=["Custom profile: not measured. The card's figures do not apply to it."],
        )
    except ValidationError as exc:
        raise CustomProfileError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None


def _describe(env_add: dict[str, str], env_replace: dict[str, str], env_remove: list[str], args_set: dict[str, str], args_remove: list[str]) -> str:
    parts = [f"{k}={v}" for k, v in {**env_replace, **env_add}.items()]
    parts += [f"unset {k}" for k in env_remove]
    parts += [f"{k} {v}".strip() for k, v in args_set.items()]
    parts += [f"no {k}" for k in args_remove]
    return ", ".join(p.removeprefix("VLLM_MOE_W2_") for p in parts) or "same as the base command"


def findings_for(recipe: Recipe, profile: ProfileSpec) -> list[Finding]:
    """The card's measured warnings that apply to this profile's effective command."""
    env = dict(profile_env(recipe, profile))
    argv = profile_args(recipe, profile)
    out: list[Finding] = []
    for f in recipe.findings:
        if f.kind == "env_equals":
            hit = env.get(f.key) == f.value
        elif f.kind == "env_present":
            hit = f.key in env
        elif f.kind == "arg_present":
            hit = f.key in argv
        else:  # arg_value_above
            hit = f.key in argv and _above(argv, f.key, f.value)
        if hit:
            out.append(f)
    return out


def _above(argv: list[str], flag: str, limit: str) -> bool:
    i = argv.index(flag)
    try:
        return i + 1 < len(argv) and float(argv[i + 1]) > float(limit)
    except ValueError:
        return False


# --- persistence -------------------------------------------------------------------------------

def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string (ASCII, \u escapes) is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def to_toml(profile: ProfileSpec) -> str:
    data = profile.model_dump(exclude_none=True, exclude_defaults=False)
    for k in ("decode", "quality", "delta_vs_1"):
        data.pop(k, None)
    lines = ["# moet-panel custom profile (not measured). Edit in the panel; validated on load."]
    lines += [f"{k} = {_toml_value(v)}" for k, v in data.items()]
    return "\n".join(lines) + "\n"


def save_custom_profile(settings: Settings, profile: ProfileSpec) -> Path:
    """Write atomically; the written file is read back and validated before it replaces anything."""
    if profile.measured:
        raise CustomProfileError("custom profiles are never 'measured'")
    folder = profiles_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    text = to_toml(profile)
    if _parse(text, settings.recipe, f"{profile.id}.toml") != profile:
        raise CustomProfileError("internal error: the profile did not survive a save/load round trip")
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".toml")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    target = folder / f"{profile.id}.toml"
    os.replace(tmp, target)
    return target


def delete_custom_profile(settings: Settings, profile_id: str) -> bool:
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,47}", profile_id):
        return False
    path = profiles_dir(settings) / f"{profile_id}.toml"
    if not path.exists():
        return False
    path.unlink()
    return True


def _parse(text: str, recipe: Recipe, where: str) -> ProfileSpec:
    try:
        data = tomllib.loads(text)
        profile = ProfileSpec.model_validate(data)
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise CustomProfileError(f"{where}: {exc}") from None
    if profile.measured or profile.decode or profile.quality or profile.delta_vs_1:
        raise CustomProfileError(f"{where}: custom profiles must have measured = false and no figures")
    for name in list(profile.env_replace) + list(profile.env_remove):
        if name not in recipe.serve.env:
            raise CustomProfileError(f"{where}: env {name} is not a base setting of recipe {recipe.id}")
    for name in list(profile.env_add) + list(profile.env_replace) + list(profile.env_remove):
        _check_env_change(name, None)
    for flag, value in profile.args_set.items():
        _check_arg(flag, value)
    for flag in profile.args_remove:
        _check_arg(flag, None)
    return profile


def load_custom_profiles_report(settings: Settings) -> LoadReport:
    folder = profiles_dir(settings)
    if not folder.is_dir():
        return LoadReport()
    taken = {p.id for p in settings.recipe.profiles}
    profiles: list[ProfileSpec] = []
    problems: list[str] = []
    for path in sorted(folder.glob("*.toml")):
        try:
            profile = _parse(path.read_text(encoding="utf-8"), settings.recipe, str(path))
        except (OSError, UnicodeDecodeError, CustomProfileError) as exc:
            problems.append(f"skipped {path.name}: {exc}")
            continue
        if profile.id in taken or path.stem != profile.id:
            problems.append(f"skipped {path.name}: id {profile.id!r} clashes or does not match the file name")
            continue
        taken.add(profile.id)
        profiles.append(profile)
    return LoadReport(profiles=profiles, problems=problems)


def load_custom_profiles(settings: Settings) -> list[ProfileSpec]:
    """Valid custom profiles of this data dir (invalid files are skipped; see load_custom_profiles_report)."""
    return load_custom_profiles_report(settings).profiles


# --- the editor's form ---------------------------------------------------------------------------

POLICY_ENV, HYST_ENV, PROMOTE_ENV, POOL_ENV, GATE_ENV = (
    "VLLM_MOE_W2_DELTA_POLICY", "VLLM_MOE_W2_PROMO_HYST", "VLLM_MOE_W2_DELTA_PROMOTE", "VLLM_MOE_W2_DELTA_GB", "VLLM_MOE_W2_GATE",
)
_FORM_ENV = (POLICY_ENV, HYST_ENV, PROMOTE_ENV, POOL_ENV, GATE_ENV)


@dataclass(frozen=True)
class EditorForm:
    """What the Profiles tab's editor shows: the card's knobs, plus free-form env lines."""

    policy: str = "freq"
    promo_hyst: str = ""
    delta_promote: str = ""
    delta_gb: str = ""
    gate: bool = False
    max_model_len: str = ""
    enforce_eager: bool = False
    speculative: str = ""
    extra_env: str = ""  # lines: NAME=value (set) or -NAME (unset)


def form_from_profile(recipe: Recipe, profile: ProfileSpec) -> EditorForm:
    k = knobs_of(recipe, profile)
    return EditorForm(
        policy=k.env.get(POLICY_ENV, "freq"),
        promo_hyst=k.env.get(HYST_ENV, ""),
        delta_promote=k.env.get(PROMOTE_ENV, ""),
        delta_gb=k.env.get(POOL_ENV, ""),
        gate=k.env.get(GATE_ENV, "0") == "1",
        max_model_len=k.args.get("--max-model-len") or "",
        enforce_eager=k.args.get("--enforce-eager") is not None,
        speculative=k.args.get("--speculative-config") or "",
    )


def knobs_from_form(recipe: Recipe, base: ProfileSpec, form: EditorForm) -> Knobs:
    """Apply the form to the base profile's effective env/args. Raises CustomProfileError on bad input."""
    current = knobs_of(recipe, base)
    env = dict(current.env)
    for name, raw in ((POLICY_ENV, form.policy), (HYST_ENV, form.promo_hyst), (PROMOTE_ENV, form.delta_promote), (POOL_ENV, form.delta_gb)):
        value = (raw or "").strip()
        if not value:
            env.pop(name, None)
        elif name != POLICY_ENV and not value.isdigit():
            raise CustomProfileError(f"{name} must be a whole number (or blank to leave it unset), got {value!r}")
        else:
            env[name] = value
    if form.policy and form.policy not in ("freq", "need"):
        raise CustomProfileError(f"{POLICY_ENV} must be freq or need")
    env[GATE_ENV] = "1" if form.gate else "0"
    for no, line in enumerate((form.extra_env or "").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            _check_env_change(line[1:], None)
            env.pop(line[1:], None)
            continue
        name, sep, value = line.partition("=")
        if not sep:
            raise CustomProfileError(f"other env, line {no}: expected NAME=value or -NAME, got {line!r}")
        _check_env_change(name.strip(), value)
        env[name.strip()] = value
    args = dict(current.args)
    args["--max-model-len"] = (form.max_model_len or "").strip() or None
    args["--enforce-eager"] = "" if form.enforce_eager else None
    args["--speculative-config"] = (form.speculative or "").strip() or None
    return Knobs(env=env, args=args)


def profile_from_form(recipe: Recipe, base: ProfileSpec, name: str, form: EditorForm, taken_ids: set[str]) -> ProfileSpec:
    knobs = knobs_from_form(recipe, base, form)
    return make_custom_profile(recipe, base, name, knobs.env, knobs.args, taken_ids)
