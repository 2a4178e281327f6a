"""Custom profiles: clone a recipe profile, change knobs inside the schema, save it in the data dir.

A custom profile is a `ProfileSpec` like the recipe's (same validation, same `build_run_spec`), stored as
`<state_dir>/profiles/<id>.toml` with `measured = false` and no figures: the panel never invents numbers
for a configuration nobody measured. What a user may change is deliberately narrow:
env variables with a known prefix (not the cache/identity pins) and a short whitelist of engine args,
the ones the card has findings about.
"""

from __future__ import annotations


import json
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import ValidationError

from app.backend import oplog
from app.backend.files.atomic import atomic_write
from app.backend.recipe.effective import EffectiveCommand
from app.backend.recipe.schema import ENV_NAME_RE, Finding, ProfileSpec, Recipe, control_char
from app.backend.recipe.toml_bounded import TomlLimitError, loads_bounded

from app.backend.config.settings import Settings

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
# Bounds on what a user types (docs/card.md, "Custom profiles: what is refused"): Linux refuses one argv string over 128 KiB
# ("argument list too long") only when the container starts; refuse far earlier, at the editor.
MAX_VALUE_CHARS = 1024
MAX_NAME_CHARS = 80
MAX_ENV_LINES = 64
MAX_PROFILE_FILE_BYTES = 64 * 1024
# Engine switches that open the engine to its clients or load code: never set by accident. A custom
# profile may set them only with the editor's expert option ticked; each warning names the risk.
EXPERT_ENV: dict[str, str] = {
    "VLLM_SERVER_DEV_MODE": ("exposes vLLM's development endpoints (reset caches, sleep/wake, collective RPC) to anyone who can "
                             "reach the engine port"),
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "lets the engine unpickle messages: a crafted message runs arbitrary code inside the container",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "lets any API client load LoRA adapters from paths or repos at runtime",
    "VLLM_PLUGINS": "loads the named Python plugins (code) into the engine at start",
    "VLLM_LOGGING_CONFIG_PATH": "a logging config can instantiate arbitrary Python classes (code) at start",
    "VLLM_CONFIGURE_LOGGING": "changes how the engine logs; the panel's log reader and diagnosis may stop working",
    "VLLM_NCCL_SO_PATH": "loads a shared library from the given path into the engine",
    "VLLM_API_KEY": "puts a key on the engine's API; the panel's health checks and chat calls then fail with 401",
    "VLLM_HOST_IP": "changes the address vLLM's internal processes talk on",
    "VLLM_PORT": "changes vLLM's internal communication port (not the API port)",
    "VLLM_RPC_BASE_PATH": "moves the engine's IPC sockets",
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "bypasses vLLM's own --max-model-len check; the card: 256K is a hard ceiling on this checkpoint",
    "VLLM_DEBUG_LOG_API_SERVER_RESPONSE": "writes every chat answer into the engine log",
    "VLLM_TORCH_PROFILER_DIR": "enables the profiler endpoints and writes traces inside the container",
    "VLLM_TRACE_FUNCTION": "logs every Python function call: huge logs and a much slower engine",
    "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "keeps the API answering after the engine died, so the panel's health check can lie",
    "VLLM_USE_MODELSCOPE": "downloads models from ModelScope instead of using the mounted checkpoint",
    "VLLM_MODEL_REDIRECT_PATH": "redirects model loading to other paths",
}


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
    cmd = recipe.command(profile)
    return Knobs(env=cmd.env_dict, args=_whitelisted_args(cmd))


def _whitelisted_args(cmd: EffectiveCommand) -> dict[str, str | None]:
    """The editable args as the editor holds them: None = absent, "" = a bare flag, else the value."""
    args: dict[str, str | None] = {}
    for flag, takes_value in ARG_WHITELIST.items():
        value = cmd.arg_value(flag) if takes_value else None
        args[flag] = (value or "") if cmd.has_arg(flag) else None
    return args


def is_ascii_number(value: str) -> bool:
    """ASCII digits only: str.isdigit() also accepts '²' and Arabic-Indic digits, which the engine cannot parse."""
    return bool(re.fullmatch(r"[0-9]{1,12}", value))


def _check_value(value: str, what: str) -> None:
    if len(value) > MAX_VALUE_CHARS:
        raise CustomProfileError(f"{what}: value is {len(value):,} characters; the limit is {MAX_VALUE_CHARS:,}")
    bad = control_char(value)
    if bad:
        raise CustomProfileError(f"{what}: value must be a single line without control or format characters; found {bad}")


def _check_env_change(name: str, value: str | None, *, expert: bool = False) -> None:
    if len(name) > 128 or not ENV_NAME_RE.fullmatch(name):
        raise CustomProfileError(f"env name {name[:64]!r} must match [A-Z0-9_]+ (at most 128 characters)")
    if not name.startswith(ENV_PREFIXES):
        raise CustomProfileError(f"env {name}: custom profiles may only set variables starting with {', '.join(ENV_PREFIXES)}")
    if name in PROTECTED_ENV:
        raise CustomProfileError(f"env {name} ties the container to the downloaded cache; a custom profile cannot change it")
    if name in EXPERT_ENV and value is not None and not expert:
        raise CustomProfileError(f"env {name} is an expert setting: it {EXPERT_ENV[name]}. Tick the expert option to set it anyway")
    if value is not None:
        _check_value(value, f"env {name}")


def expert_risks(profile: ProfileSpec) -> list[str]:
    """One warning per expert env a profile sets, naming the risk (shown wherever the profile's findings are)."""
    return [f"{k} {EXPERT_ENV[k]}." for k in {**profile.env_replace, **profile.env_add} if k in EXPERT_ENV]


def _check_arg(flag: str, value: str | None) -> None:
    if flag not in ARG_WHITELIST:
        raise CustomProfileError(f"engine argument {flag[:64]} cannot be changed here (allowed: {', '.join(ARG_WHITELIST)})")
    if value is None or not ARG_WHITELIST[flag]:
        return
    if not value.strip():
        raise CustomProfileError(f"{flag} needs a value (or leave it unset)")
    _check_value(value, flag)
    if flag in _NUMERIC_ARGS and not is_ascii_number(value):
        raise CustomProfileError(f"{flag} must be a whole number in ASCII digits 0-9, got {value[:32]!r}")


def make_custom_profile(
    recipe: Recipe,
    base: ProfileSpec,
    name: str,
    env: dict[str, str],
    args: dict[str, str | None],
    taken_ids: set[str],
    *,
    expert: bool = False,
) -> ProfileSpec:
    """Express the wanted effective env/args as changes to the recipe's base command.

    Args:
        expert: the user ticked the expert option, so EXPERT_ENV names may be set (each one is warned about).

    Raises:
        CustomProfileError: bad name, id clash, disallowed env/arg, or a schema violation.
    """
    if len(name) > MAX_NAME_CHARS:
        raise CustomProfileError(f"the profile name is {len(name):,} characters; the limit is {MAX_NAME_CHARS}")
    bad = control_char(name)
    if bad:
        raise CustomProfileError(f"the profile name must not contain control or format characters; found {bad}")
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
            _check_env_change(k, env.get(k), expert=expert)
    env_replace = {k: v for k, v in env.items() if k in base_env and v != base_env[k]}
    env_remove = [k for k in base_env if k not in env]
    env_add = {k: v for k, v in env.items() if k not in base_env}
    base_args = _whitelisted_args(recipe.serve.command)
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
            expert=expert and any(k in EXPERT_ENV for k in {**env_add, **env_replace}),
            based_on=base.id,
            notes=["Custom profile: not measured. The card's figures do not apply to it."],
        )
    except ValidationError as exc:
        raise CustomProfileError("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())) from None


def _describe(env_add: dict[str, str], env_replace: dict[str, str], env_remove: list[str], args_set: dict[str, str],
              args_remove: list[str]) -> str:
    parts = [f"{k}={v}" for k, v in {**env_replace, **env_add}.items()]
    parts += [f"unset {k}" for k in env_remove]
    parts += [f"{k} {v}".strip() for k, v in args_set.items()]
    parts += [f"no {k}" for k in args_remove]
    return ", ".join(p.removeprefix("VLLM_MOE_W2_") for p in parts) or "same as the base command"


def findings_for(recipe: Recipe, profile: ProfileSpec) -> list[Finding]:
    """The card's measured warnings whose conditions hold for this profile's effective command."""
    cmd = recipe.command(profile)
    return [f for f in recipe.findings if f.applies(cmd)]


# --- persistence -------------------------------------------------------------------------------

def to_toml(profile: ProfileSpec) -> str:
    data = profile.model_dump(exclude_none=True, exclude_defaults=False)
    for k in ("decode", "quality", "delta_vs_1"):
        data.pop(k, None)
    return "# moet-panel custom profile (not measured). Edit in the panel; validated on load.\n" + tomli_w.dumps(data)


def save_custom_profile(settings: Settings, profile: ProfileSpec, who: str = oplog.PAGE) -> Path:
    """Write atomically; the written file is read back and validated before it replaces anything. `who`: who
    asked (the operator's log)."""
    if profile.measured:
        raise CustomProfileError("custom profiles are never 'measured'")
    folder = profiles_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    text = to_toml(profile)
    if _parse(text, settings.recipe, f"{profile.id}.toml") != profile:
        raise CustomProfileError("internal error: the profile did not survive a save/load round trip")
    target = folder / f"{profile.id}.toml"
    atomic_write(target, text, mode=0o600)
    oplog.decision("profiles", "setting_changed", who=who, setting="custom_profile", profile=profile.id, new="saved")
    return target


def delete_custom_profile(settings: Settings, profile_id: str, who: str = oplog.PAGE) -> bool:
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,47}", profile_id):
        return False
    path = profiles_dir(settings) / f"{profile_id}.toml"
    if not path.exists():
        return False
    path.unlink()
    oplog.decision("profiles", "setting_changed", who=who, setting="custom_profile", profile=profile_id, new="deleted")
    return True


def _parse(text: str, recipe: Recipe, where: str) -> ProfileSpec:
    try:
        data = loads_bounded(text, max_bytes=MAX_PROFILE_FILE_BYTES, max_depth=4)
        profile = ProfileSpec.model_validate(data)
    except TomlLimitError as exc:
        raise CustomProfileError(f"{where}: refused: {exc}") from None
    except (tomllib.TOMLDecodeError, ValidationError) as exc:
        raise CustomProfileError(f"{where}: {exc}") from None
    if profile.measured or profile.decode or profile.quality or profile.delta_vs_1:
        raise CustomProfileError(f"{where}: custom profiles must have measured = false and no figures")
    for name in list(profile.env_replace) + list(profile.env_remove):
        if name not in recipe.serve.env:
            raise CustomProfileError(f"{where}: env {name} is not a base setting of recipe {recipe.id}")
    for name, value in {**profile.env_add, **profile.env_replace}.items():
        _check_env_change(name, value, expert=profile.expert)
    for name in profile.env_remove:
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
            if path.stat().st_size > MAX_PROFILE_FILE_BYTES:
                raise CustomProfileError(f"{path}: refused: over {MAX_PROFILE_FILE_BYTES:,} bytes")
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
    max_num_seqs: str = ""
    expert: bool = False  # allow EXPERT_ENV names (each one is warned about)


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
        max_num_seqs=k.args.get("--max-num-seqs") or "",
        expert=profile.expert,
    )


def knobs_from_form(recipe: Recipe, base: ProfileSpec, form: EditorForm, *, strict: bool = False) -> Knobs:
    """Apply the form to the base profile's effective env/args. Raises CustomProfileError naming every
    problem of the form at once, not only the first (issue 29). `strict` (the editor's Save and Check):
    also refuse what the card rules out or the engine would reject only at start (`_sane_args`); the
    builder alone accepts those, so hostile values can be tested as they reach the command."""
    problems: list[str] = []

    def check(fn: Callable[..., object], *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except CustomProfileError as exc:
            problems.append(str(exc))

    current = knobs_of(recipe, base)
    env = dict(current.env)
    for name, raw in ((POLICY_ENV, form.policy), (HYST_ENV, form.promo_hyst), (PROMOTE_ENV, form.delta_promote), (POOL_ENV, form.delta_gb)):
        value = (raw or "").strip()
        if not value:
            env.pop(name, None)
        elif name != POLICY_ENV and not is_ascii_number(value):
            problems.append(f"{name} must be a whole number in ASCII digits 0-9 (or blank to leave it unset), got {value[:32]!r}")
        else:
            env[name] = value
    if form.policy and form.policy not in ("freq", "need"):
        problems.append(f"{POLICY_ENV} must be freq or need")
    env[GATE_ENV] = "1" if form.gate else "0"
    # Split on newlines only: a U+2028 or U+0085 inside a value must be refused by name, not split a line.
    lines = [ln for ln in (form.extra_env or "").split("\n") if ln.strip(" \t\r")]
    if len(lines) > MAX_ENV_LINES:
        problems.append(f"other env: {len(lines)} lines; at most {MAX_ENV_LINES} changes")
        lines = []
    for no, line in enumerate(lines, 1):
        line = line.strip(" \t\r")
        if not line or line.startswith("#"):
            continue
        if line.startswith("-"):
            check(_check_env_change, line[1:], None)
            env.pop(line[1:], None)
            continue
        name, sep, value = line.partition("=")
        if not sep:
            problems.append(f"other env, line {no}: expected NAME=value or -NAME, got {line[:64]!r}")
            continue
        name = name.strip()
        check(_check_env_change, name, value, expert=form.expert)
        env[name] = value
    args = dict(current.args)
    args["--max-model-len"] = (form.max_model_len or "").strip() or None
    args["--enforce-eager"] = "" if form.enforce_eager else None
    args["--speculative-config"] = (form.speculative or "").strip() or None
    args["--max-num-seqs"] = (form.max_num_seqs or "").strip() or None
    for flag in ("--max-model-len", "--max-num-seqs", "--speculative-config"):
        check(_check_arg, flag, args[flag])
    if strict:
        problems += _sane_args(recipe, args)
    if problems:
        raise CustomProfileError(problems[0] if len(problems) == 1 else
                                 f"{len(problems)} problems: " + " · ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))
    return Knobs(env=env, args=args)


def _sane_args(recipe: Recipe, args: dict[str, str | None]) -> list[str]:
    """Values the engine would take but the card rules out, or the engine would reject only at start."""
    out = []
    ceiling = recipe.context.validated_max_tokens  # the card's validated window (assets/recipes/*.toml)
    mml = args.get("--max-model-len")
    if mml is None:
        out.append(f"--max-model-len needs a value: unset, the engine serves the model's whole window, past the "
                   f"card's validated {ceiling:,} tokens")
    elif is_ascii_number(mml) and not 1 <= int(mml) <= ceiling:
        out.append(f"--max-model-len {mml} is outside 1–{ceiling:,}: the card validated {ceiling:,} tokens as the ceiling")
    seqs = args.get("--max-num-seqs")
    if seqs is not None and is_ascii_number(seqs) and int(seqs) < 1:
        out.append("--max-num-seqs must be at least 1 (0 would let the engine serve no request)")
    spec = args.get("--speculative-config")
    if spec is not None and spec.strip():
        try:
            parsed = json.loads(spec)
        except ValueError as exc:
            out.append(f"--speculative-config must be a JSON object, e.g. {{\"method\": \"mtp\", \"num_speculative_tokens\": 1}}: {exc}")
        else:
            if not isinstance(parsed, dict):
                out.append("--speculative-config must be a JSON object ({...}), not " + type(parsed).__name__)
    return out


def profile_from_form(recipe: Recipe, base: ProfileSpec, name: str, form: EditorForm, taken_ids: set[str],
                      *, strict: bool = False) -> ProfileSpec:
    knobs = knobs_from_form(recipe, base, form, strict=strict)
    return make_custom_profile(recipe, base, name, knobs.env, knobs.args, taken_ids, expert=form.expert)
