"""Typed schema of a recipe file (assets/recipes/*.toml).

A recipe holds every fact of a model card that the panel uses: artifacts, pins, the base
`docker run`, the serving profiles with their measured figures, the studies behind them and the
card's warnings. Every model is strict (`extra="forbid"`) so a typo is an error, not a silent
default. Values that reach `docker run` are validated here: they are passed as argument lists,
never through a shell, and may not contain control characters.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.backend.recipe.effective import EffectiveCommand

ENV_NAME_RE = re.compile(r"^[A-Z0-9_]+$")
ID_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,47}$")
# Docker image reference: [registry/]name[:tag]; conservative subset, no whitespace or shell text.
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$")
CONTAINER_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
SIZE_RE = re.compile(r"^[0-9]+[bkmg]?$")
# Unicode categories refused in anything that reaches `docker run`: controls (C0, DEL, C1 such as U+009B
# CSI), format characters (U+202E RIGHT-TO-LEFT OVERRIDE, zero-width joiners), line/paragraph separators,
# surrogates, private-use and unassigned code points. Each can hide or reorder text in a terminal or page.
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})


def control_char(value: str) -> str | None:
    """The first refused character of `value`, as 'U+XXXX (NAME)', or None."""
    for ch in value:
        if unicodedata.category(ch) in REFUSED_CATEGORIES:
            return f"U+{ord(ch):04X} ({unicodedata.name(ch, 'unnamed')})"
    return None


def _no_control(value: str, what: str) -> str:
    bad = control_char(value)
    if bad:
        raise ValueError(
            f"{what} must be a single line without control or format characters (newline, tab, NUL, "
            f"bidi overrides); found {bad}"
        )
    return value


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _number_in(text: str) -> float | None:
    """The number a card figure states: '~76' → 76, '~25' → 25, '−1.37' → -1.37, '148–190' → None."""
    t = text.strip().lstrip("~≈").rstrip("*%").replace("−", "-").replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


class Figure(Strict):
    """A measured number with the card's own words for it."""

    value: float
    text: str = Field("", description="the figure as the card prints it ('75.0', '~76'); empty = derive from value")
    unit: str = ""
    note: str = Field(description="the card's wording, cited verbatim")

    @model_validator(mode="after")
    def _text_states_value(self) -> "Figure":
        if self.text and _number_in(self.text) != self.value:
            raise ValueError(f"text {self.text!r} does not state value {self.value}")
        return self

    @property
    def shown(self) -> str:
        """The card's form of the figure (decimals and '~' kept); `{value:g}` only when the recipe has no text."""
        return self.text or f"{self.value:g}"


class CardNumber(Strict):
    """A study-table number with the card's text form beside it ('11.00', '~76', '~25')."""

    value: float
    text: str

    @model_validator(mode="after")
    def _text_states_value(self) -> "CardNumber":
        if _number_in(self.text) != self.value:
            raise ValueError(f"text {self.text!r} does not state value {self.value}")
        return self


Cell = CardNumber | str | float | int


def cell_text(cell: Cell) -> str:
    """What a view prints for a study cell: the card's text form when the recipe keeps one."""
    if isinstance(cell, CardNumber):
        return cell.text
    if isinstance(cell, (int, float)) and not isinstance(cell, bool):
        return f"{cell:g}"
    return str(cell)


class DeltaCI(Strict):
    """Quality difference vs profile 1 on the /30 rubric, with its 90% confidence interval."""

    mean: float
    ci90: tuple[float, float]
    note: str

    @model_validator(mode="after")
    def _ordered(self) -> "DeltaCI":
        lo, hi = self.ci90
        if lo > hi:
            raise ValueError("ci90 must be [low, high] with low <= high")
        return self


class HubSpec(Strict):
    endpoint: str = "https://huggingface.co"
    repo: str
    revision: str = "main"
    card_url: str = ""

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*", v):
            raise ValueError("expected OWNER/NAME")
        return v


class ModelSpec(Strict):
    name: str
    revision: str
    served_name: str
    ckpt_id: str = Field(description="identity pin for VLLM_MOE_W2_CKPT_ID, from the cache's meta.json")
    ckpt_id_env: str = "VLLM_MOE_W2_CKPT_ID"
    params_note: str = ""

    @field_validator("served_name", "ckpt_id", "name", "revision")
    @classmethod
    def _single_line(cls, v: str) -> str:
        return _no_control(v, "value")


class ArtifactSpec(Strict):
    id: str
    prefix: str = Field(description="part-name prefix on the Hub, e.g. model.tar.zst.part.")
    yields: str = Field(description="top-level directory the archive extracts to")
    extracted_gib: float
    contents: str
    required_for_serving: bool = True

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not ID_RE.fullmatch(v):
            raise ValueError("expected a lower-case id like 'model'")
        return v

    @field_validator("yields")
    @classmethod
    def _yields(cls, v: str) -> str:
        return _relative_path(v)


class EngineSource(Strict):
    repo_url: str
    commit: str
    dockerfile: str
    image: str
    build_env: dict[str, str] = {}
    boot_timeout_s: int = Field(2400, ge=10, le=6 * 3600)
    stop_grace_s: int = Field(90, ge=1, le=600)
    # Liveness after ready (docs/engine.md "Liveness"): requests running and no prompt/generation token
    # counted for this long = stalled. 90 s > a full 262144-token prefill at the card's ~6000 tok/s (~44 s), x2.
    stall_after_s: float = Field(90.0, ge=1, le=3600)
    restart_on_stall: bool = False  # restart on the same profile when stalled (old logs/diagnosis kept)
    # Supervision (docs/engine.md, "Keeps serving"): restart a crashed/stalled engine ("on-failure": backoff,
    # 3 tries in 15 min, non-healing classes never) or leave it ("never"). MOET_PANEL_ENGINE_RESTART and the
    # panel's Service tab override it.
    restart: Literal["on-failure", "never"] = "on-failure"
    # Generation canary while ready and idle: a 1-token completion every N s (0 = off); two failures = stalled.
    canary_interval_s: float = Field(30.0, ge=0, le=3600)
    canary_timeout_s: float = Field(10.0, ge=1, le=600)
    # Drain (docs/engine.md "Keeps serving"): a stop or switch first waits up to this for the answers streaming
    # through the gateway and the Chat tab (0 = stop at once). The Service tab overrides it.
    drain_grace_s: float = Field(60.0, ge=0, le=3600)
    vllm_fork_commit: str = ""
    quantizer_abi: str = ""
    # Readiness demands the FP4 pool sizing line when the env asks for a pool ("from_env", docs/engine.md);
    # "never" for engines without one (upstream vLLM: assets/recipes/vllm-cpu-tiny.toml).
    pool_line: Literal["from_env", "never"] = "from_env"

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if not IMAGE_RE.fullmatch(v):
            raise ValueError("expected a docker image reference like 'name:tag'")
        return v

    @field_validator("build_env")
    @classmethod
    def _build_env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)


class Mount(Strict):
    source: str = Field(description="path relative to the data dir (or an artifact's directory)")
    target: str
    read_only: bool = False

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        return _relative_path(v)

    @field_validator("target")
    @classmethod
    def _target(cls, v: str) -> str:
        _no_control(v, "mount target")
        p = PurePosixPath(v)
        if not p.is_absolute() or ".." in p.parts or "," in v or ":" in v:
            raise ValueError("mount target must be an absolute container path without '..', ',' or ':'")
        return v


class ServeSpec(Strict):
    """The card's base `docker run` (profile 1), as data."""

    container_name: str
    gpus: str = Field("", description="docker --gpus value, e.g. '\"device=0\"'; empty = no GPU")
    network: Literal["host", "bridge", "none"] = "host"
    ipc: Literal["host", "private", "shareable", ""] = "host"
    shm_size: str = ""
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    # where the engine the panel starts listens (docs/engine.md, "Where the engine listens"): "uds" = vLLM's --uds
    # on a socket in the state dir (no TCP port); "tcp" = host:port, for an engine without --uds
    listen: Literal["uds", "tcp"] = "uds"
    mounts: list[Mount]
    env: dict[str, str]
    args: list[str]

    @property
    def command(self) -> EffectiveCommand:
        """The card's base command (profile 1's env and args)."""
        return EffectiveCommand.of(self.env, self.args)

    @field_validator("container_name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not CONTAINER_NAME_RE.fullmatch(v):
            raise ValueError("expected a docker container name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: str) -> str:
        if v and not re.fullmatch(r'all|[0-9]+|"?device=[0-9A-Za-z,-]+"?', v):
            raise ValueError("expected 'all', a count, or '\"device=0\"'")
        return v

    @field_validator("shm_size")
    @classmethod
    def _shm(cls, v: str) -> str:
        if v and not SIZE_RE.fullmatch(v):
            raise ValueError("expected a size like '32g'")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)

    @field_validator("args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        return [_no_control(a, "engine argument") for a in v]


class ProfileSpec(Strict):
    id: str
    number: int = Field(ge=1)
    title: str
    summary: str
    recommended: bool = False
    scheduler_setting: str
    env_add: dict[str, str] = {}
    env_replace: dict[str, str] = {}
    env_remove: list[str] = []
    decode: Figure | None = None
    quality: Figure | None = None
    quality_label: str = ""
    delta_vs_1: DeltaCI | None = None
    notes: list[str] = []
    measured: bool = True
    # Engine-argument changes relative to serve.args (custom profiles): flag -> value ("" = bare flag).
    args_set: dict[str, str] = {}
    args_remove: list[str] = []
    based_on: str = ""  # custom profiles: the profile this one was cloned from
    expert: bool = False  # custom profiles: the user ticked the expert option (dangerous engine env allowed)

    @field_validator("args_set")
    @classmethod
    def _args_set(cls, v: dict[str, str]) -> dict[str, str]:
        for flag, value in v.items():
            _check_flag(flag)
            _no_control(value, f"argument {flag}")
            if value.startswith("-"):
                raise ValueError(f"value of {flag} must not start with '-' (it would read as another option)")
        return v

    @field_validator("args_remove")
    @classmethod
    def _args_remove(cls, v: list[str]) -> list[str]:
        for flag in v:
            _check_flag(flag)
        return v

    @field_validator("id")
    @classmethod
    def _id(cls, v: str) -> str:
        if not ID_RE.fullmatch(v):
            raise ValueError("expected a lower-case id like 'quality'")
        return v

    @field_validator("env_add", "env_replace")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)

    @field_validator("env_remove")
    @classmethod
    def _env_remove(cls, v: list[str]) -> list[str]:
        for name in v:
            if not ENV_NAME_RE.fullmatch(name):
                raise ValueError(f"env name {name!r} must match [A-Z0-9_]+")
        return v


class StudyTable(Strict):
    id: str
    title: str
    columns: list[str]
    rows: list[list[Cell]]
    note: str = ""
    details: list[str] = []  # the card's further statistics for this study, verbatim
    footnotes: list[str] = []  # the card's footnotes to cells marked '*', verbatim

    @model_validator(mode="after")
    def _widths(self) -> "StudyTable":
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(f"row {i} has {len(row)} cells, expected {len(self.columns)}")
        return self


class Sampling(Strict):
    temperature: float = Field(ge=0, le=2)
    top_p: float = Field(gt=0, le=1)
    min_p: float = Field(ge=0, le=1)
    note: str
    never_zero_note: str


class NeedleResult(Strict):
    length: str
    result: str
    note: str = ""


class ContextSpec(Strict):
    validated_max_tokens: int
    fails_at_tokens: int
    note: str
    needles: list[NeedleResult] = []
    needles_title: str = ""  # the card's heading of the needle table (it names the depths)


class VramSpec(Strict):
    expected_gib: float
    total_gib: float
    note: str


class Requirements(Strict):
    gpu: str
    compute_capability: str = Field(description="e.g. '12.0' for sm_120; empty = any")
    vram_gb: float
    ecc: Literal["off", "any"] = "any"
    ecc_cost_gib: float = 0
    ecc_note: str = ""
    host_ram_gb: float = Field(0, description="below this, a planes-cache MISS (re-staging) OOM-kills the host")
    host_ram_note: str = ""
    gpu_count: int = Field(1, ge=0)
    multi_gpu_note: str = ""  # shown in preflight when more than one GPU is visible


class RegenerateSpec(Strict):
    """The card's recipe for rebuilding the caches; the panel states it and does not run it (docs/card.md)."""

    note: str
    host_ram_gib: float
    gpu_count: int = 1
    base_cache_gb: float = 0
    minutes: float = 0
    measured_on: str = ""


FindingKind = Literal["env_equals", "env_present", "arg_present", "arg_value_above"]


class Condition(Strict):
    """One test on a profile's effective command: an env variable or an engine argument, and what must hold.

    Exactly one of `env` / `arg`, and exactly one of: `equals`, `absent` (true: not in the command; false: in
    it), `above` / `below` (numeric value; a non-number does not match), `matches` (regular expression,
    case-insensitive, searched in the value). `negate` inverts the result (e.g. "not equals 1").
    """

    env: str = ""
    arg: str = ""
    equals: str | None = None
    absent: bool | None = None
    above: float | None = None
    below: float | None = None
    matches: str | None = None
    negate: bool = False

    @model_validator(mode="after")
    def _one_test(self) -> "Condition":
        if bool(self.env) == bool(self.arg):
            raise ValueError("a condition names exactly one of env or arg")
        tests = [t for t in (self.equals, self.absent, self.above, self.below, self.matches) if t is not None]
        if len(tests) != 1:
            raise ValueError("a condition has exactly one of equals, absent, above, below, matches")
        if self.matches is not None:
            try:
                re.compile(self.matches)
            except re.error as exc:
                raise ValueError(f"matches: not a regular expression: {exc}") from None
        return self

    def holds(self, cmd: EffectiveCommand) -> bool:
        if self.env:
            present, value = cmd.has_env(self.env), cmd.env_value(self.env)
        else:
            present, value = cmd.has_arg(self.arg), cmd.arg_value(self.arg)
        if self.absent is not None:
            hit = present != self.absent
        elif self.equals is not None:
            hit = value == self.equals
        elif self.matches is not None:
            hit = value is not None and re.search(self.matches, value, re.I) is not None
        else:
            number = _number_in(value) if value is not None else None
            if number is None:
                hit = False
            elif self.above is not None:
                hit = number > self.above
            else:
                hit = number < (self.below if self.below is not None else 0)
        return hit != self.negate


class Finding(Strict):
    """A measured warning from the card, matched against a (custom) profile's command.

    It applies when every condition of `when` holds and, if `when_any` is given, at least one of those.
    The older one-test form (`kind` + `key` + `value`) is still read. `message` is the card's own words:
    passages separated by " … " are each verbatim in the card (tests/test_card_wording.py).
    """

    id: str
    kind: FindingKind | None = None
    key: str = ""
    value: str = ""
    when: list[Condition] = []
    when_any: list[Condition] = []
    severity: Literal["info", "warn", "error"] = "warn"
    message: str

    @model_validator(mode="after")
    def _has_condition(self) -> "Finding":
        if self.kind is None and not (self.when or self.when_any):
            raise ValueError(f"finding {self.id!r} needs conditions (when / when_any) or kind + key")
        if self.kind is not None and not self.key:
            raise ValueError(f"finding {self.id!r}: kind needs a key")
        return self

    def conditions(self) -> list[Condition]:
        """`when`, with the older kind/key/value form translated to the same conditions."""
        legacy: list[Condition] = []
        if self.kind == "env_equals":
            legacy = [Condition(env=self.key, equals=self.value)]
        elif self.kind == "env_present":
            legacy = [Condition(env=self.key, absent=False)]
        elif self.kind == "arg_present":
            legacy = [Condition(arg=self.key, absent=False)]
        elif self.kind == "arg_value_above":
            legacy = [Condition(arg=self.key, above=float(self.value))]
        return legacy + list(self.when)

    def applies(self, cmd: EffectiveCommand) -> bool:
        """Whether the card's warning applies to this effective command (Recipe.command)."""
        if not all(c.holds(cmd) for c in self.conditions()):
            return False
        return not self.when_any or any(c.holds(cmd) for c in self.when_any)


class Recipe(Strict):
    schema_version: Literal[1] = 1
    id: str
    title: str
    simulated: bool = False
    default_data_dir: str
    card_source: str = ""
    hub: HubSpec
    model: ModelSpec
    artifacts: list[ArtifactSpec]
    engine: EngineSource
    serve: ServeSpec
    profiles: list[ProfileSpec]
    sampling: Sampling
    context: ContextSpec
    vram: VramSpec
    requirements: Requirements
    studies: list[StudyTable] = []
    findings: list[Finding] = []
    pins: dict[str, str] = {}
    # The card's "why each knob" line for an env name or an engine flag (verbatim), keyed by that name.
    why: dict[str, str] = {}
    regenerate: RegenerateSpec | None = None
    card_file: str = Field("", description="the model card text shipped in the repo, relative to the repo root")

    @model_validator(mode="after")
    def _coherent(self) -> "Recipe":
        ids = [p.id for p in self.profiles]
        if len(set(ids)) != len(ids):
            raise ValueError(f"profiles: duplicate profile id in {ids}")
        if not self.profiles:
            raise ValueError("profiles: at least one profile is required")
        art_ids = [a.id for a in self.artifacts]
        if len(set(art_ids)) != len(art_ids):
            raise ValueError(f"artifacts: duplicate artifact id in {art_ids}")
        for i, p in enumerate(self.profiles):
            # Messages start with the field path ("path: text"); the loader lifts it into the path.
            for field_name, names in (("env_replace", list(p.env_replace)), ("env_remove", list(p.env_remove))):
                for name in names:
                    if name not in self.serve.env:
                        raise ValueError(
                            f"profiles[{i}].{field_name}.{name}: profile {p.id!r} changes env {name!r}, which is "
                            "not a base setting in serve.env; use env_add for new variables"
                        )
            for name in p.env_add:
                if name in self.serve.env:
                    raise ValueError(
                        f"profiles[{i}].env_add.{name}: profile {p.id!r} adds {name!r}, which is already a base "
                        "setting; use env_replace"
                    )
        pinned = self.serve.env.get(self.model.ckpt_id_env)
        if pinned is not None and pinned != self.model.ckpt_id:
            raise ValueError(f"serve.env.{self.model.ckpt_id_env}: must equal model.ckpt_id ({self.model.ckpt_id})")
        base = self.serve.command
        for flag, expected in (("--port", str(self.serve.port)), ("--served-model-name", self.model.served_name)):
            if base.has_arg(flag):
                got = base.arg_value(flag) or ""
                if got != expected:
                    raise ValueError(f"serve.args: {flag} is {got!r} but the recipe says {expected!r}")
        return self

    def command(self, profile: ProfileSpec) -> EffectiveCommand:
        """The profile's effective command: serve.env/serve.args with its changes, the card's order kept
        (replaced values stay in place, additions go last; docs/card.md)."""
        cmd = self.serve.command
        for name, value in profile.env_replace.items():
            cmd = cmd.set_env(name, value)
        for name in profile.env_remove:
            cmd = cmd.remove_env(name)
        for name, value in profile.env_add.items():
            cmd = cmd.set_env(name, value)
        for flag in profile.args_remove:
            cmd = cmd.remove_arg(flag)
        for flag, value in profile.args_set.items():
            cmd = cmd.set_arg(flag, value)
        return cmd

    def profile(self, profile_id: str) -> ProfileSpec:
        for p in self.profiles:
            if p.id == profile_id:
                return p
        known = ", ".join(p.id for p in self.profiles)
        raise KeyError(f"unknown profile {profile_id!r} (this recipe has: {known})")

    def artifact(self, artifact_id: str) -> ArtifactSpec:
        for a in self.artifacts:
            if a.id == artifact_id:
                return a
        known = ", ".join(a.id for a in self.artifacts)
        raise KeyError(f"unknown artifact {artifact_id!r} (this recipe has: {known})")

    @property
    def recommended_profile(self) -> ProfileSpec:
        return next((p for p in self.profiles if p.recommended), self.profiles[0])


def _check_env(env: dict[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if not ENV_NAME_RE.fullmatch(name):
            raise ValueError(f"env name {name!r} must match [A-Z0-9_]+")
        _no_control(value, f"env {name}")
    return env


FLAG_RE = re.compile(r"^--[a-z0-9][a-z0-9-]{0,63}$")
# Arguments the panel itself depends on (health URL, served name, weights path): never changed by a profile.
PINNED_FLAGS = frozenset({"--port", "--served-model-name", "--model", "--host", "--uds"})


def _check_flag(flag: str) -> str:
    if not FLAG_RE.fullmatch(flag):
        raise ValueError(f"engine argument {flag!r} must look like --lower-case-name")
    if flag in PINNED_FLAGS:
        raise ValueError(f"engine argument {flag} is fixed by the recipe; a profile cannot change it")
    return flag


def _relative_path(v: str) -> str:
    _no_control(v, "path")
    p = PurePosixPath(v)
    if p.is_absolute() or ".." in p.parts or v in ("", ".") or "," in v or ":" in v:
        raise ValueError("expected a relative path inside the data dir (no leading '/', no '..', ',' or ':')")
    return v
