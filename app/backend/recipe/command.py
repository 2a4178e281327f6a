"""Build the engine's `docker run` from a recipe and a profile.

One code path: `build_run_spec()` produces a `RunSpec`; the CLI renders it as shell text or JSON,
the engine controller turns the same object into docker-py arguments. Nothing here goes through a
shell: values are validated by the schema and only quoted for display.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath

from app.backend.recipe.effective import EffectiveCommand
from app.backend.recipe.endpoint import MOUNT_WHY, PORT_IGNORED_WHY, UDS_WHY, EndpointError, engine_endpoint
from app.backend.recipe.schema import ENV_NAME_RE, ProfileSpec, Recipe, _no_control

NO_REASON = "the card gives no reason for this line"

LABEL_PREFIX = "moet-panel"
TRACE_ENV = "VLLM_MOE_W2_DELTA_TRACE"
SIM_DECODE_ENV = "MOET_SIM_DECODE_TOK_S"
# The engine's bind address in every panel-run mode (issue 31, docs/gateway.md): vLLM listens on every
# interface without --host, and with --network host that is the box's network; `--api-key` never covers
# /pause, /abort_requests, /update_weights, /metrics… Other machines go through `moet-panel gateway`.
ENGINE_BIND_HOST = "127.0.0.1"
HOST_WHY = ("the engine listens on loopback only: vLLM binds every interface by default and its own --api-key "
            "leaves admin routes open; other machines use `moet-panel gateway` (keys, limits; docs/gateway.md)")


@dataclass(frozen=True)
class MountSpec:
    source: str  # absolute host path
    target: str
    read_only: bool


@dataclass(frozen=True)
class RunSpec:
    """Everything `docker run` needs, in the card's order."""

    name: str
    image: str
    gpus: str
    network: str
    ipc: str
    shm_size: str
    mounts: tuple[MountSpec, ...]
    env: tuple[tuple[str, str], ...]
    args: tuple[str, ...]
    labels: tuple[tuple[str, str], ...] = ()
    # (option text, why) for each thing the panel adds beyond the card's command
    additions: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    socket_mount: MountSpec | None = None  # the mount of the engine socket's directory (a uds engine), or None

    @property
    def env_dict(self) -> dict[str, str]:
        return self.command.env_dict

    @property
    def command(self) -> EffectiveCommand:
        """The engine env and args as run (panel additions included), for reading them (docs/card.md)."""
        return EffectiveCommand(self.env, self.args)

    @property
    def labels_dict(self) -> dict[str, str]:
        return dict(self.labels)

    def head(self) -> list[str]:
        """`docker run -d --name … --gpus … --network … --ipc … --shm-size …` (the card's first line)."""
        out = ["docker", "run", "-d", "--name", self.name]
        for flag, value in (("--gpus", self.gpus), ("--network", self.network), ("--ipc", self.ipc),
                            ("--shm-size", self.shm_size)):
            if value:
                out += [flag, value]
        return out

    def option_pairs(self) -> list[tuple[str, str]]:
        """The repeated options in the card's order: labels, mounts, env."""
        pairs = [("--label", f"{k}={v}") for k, v in self.labels]
        pairs += [("-v", f"{m.source}:{m.target}" + (":ro" if m.read_only else "")) for m in self.mounts]
        pairs += [("-e", f"{k}={v}") for k, v in self.env]
        return pairs

    def argv(self) -> list[str]:
        """The full `docker run` argument vector (what a user would type)."""
        out = self.head()
        for flag, value in self.option_pairs():
            out += [flag, value]
        return out + [self.image, *self.args]


class CommandError(ValueError):
    """The requested command cannot be built safely (bad data dir, bad extra env, ...)."""


def _single_line(value: str, what: str) -> str:
    try:
        return _no_control(value, what)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def validate_data_dir(data_dir: str) -> str:
    _single_line(data_dir, "data dir")
    p = PurePosixPath(data_dir)
    if not p.is_absolute() or ".." in p.parts or ":" in data_dir or "," in data_dir:
        raise CommandError(
            f"data dir {data_dir!r} must be an absolute path without '..', ':' or ',' (it becomes a docker -v source)"
        )
    return str(p)


def config_hash(spec: RunSpec) -> str:
    payload = asdict(spec)
    payload.pop("labels")
    payload.pop("additions")
    payload.pop("name")
    payload.pop("socket_mount")
    # the bind address the panel adds changes nothing the engine computes: results measured before it
    # (self-test, keyed by this hash) stay current (docs/engine.md)
    # the same for the unix socket (issue 40): `--uds PATH` and its mount are where it listens, not what it computes
    args = list(payload["args"])
    if args[-2:] == ["--host", ENGINE_BIND_HOST] or (len(args) >= 2 and args[-2] == "--uds"):
        payload["args"] = args[:-2]
    if spec.socket_mount is not None:
        payload["mounts"] = [m for m in payload["mounts"] if m != asdict(spec.socket_mount)]
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


CONTAINER_NAME_MAX = 63


GPU_LABEL = f"{LABEL_PREFIX}.gpu"  # the GPU a box engine runs on (absent: the one-GPU engine, GPU 0)


def managed_container_name(recipe: Recipe, profile: ProfileSpec) -> str:
    """`moet-<recipe>-<profile>`; a name over 63 characters keeps a prefix plus a hash of the whole name,
    so two long profile ids that share a prefix never map to the same container."""
    full = f"moet-{recipe.id}-{profile.id}"
    if len(full) <= CONTAINER_NAME_MAX:
        return full
    digest = hashlib.sha256(full.encode()).hexdigest()[:10]
    return f"{full[: CONTAINER_NAME_MAX - len(digest) - 1].rstrip('-_.')}-{digest}"


def build_run_spec(
    recipe: Recipe,
    profile_id: str,
    data_dir: str,
    *,
    plain: bool = False,
    extra_env: dict[str, str] | None = None,
    profiles: list[ProfileSpec] | None = None,
    image: str | None = None,
    build: str = "",
    gpu: int | None = None,
) -> RunSpec:
    """Build the `docker run` for one profile (on GPU `gpu` of a box of several: docs/engine.md "Several GPUs").

    Args:
        plain: exactly the card's command (no panel labels, no trace env).
        extra_env: panel-level additions (validated like recipe env); ignored when plain.
        profiles: the profile list to search (recipe profiles plus saved custom ones).
        image, build: the engine build to run (engine/builds/store.py chooses it: the recipe's pin unless one was
            promoted or named); None/"" = the recipe's own image.
        gpu: the GPU this engine runs on, for a box of several (None: the recipe's one engine, as written). GPU N
            gets `--gpus "device=N"` (where the recipe gives the engine a GPU at all), its own container name
            (`-gpuN` for N > 0), socket (`gpuN.sock`) or port (+N), and the label `moet-panel.gpu=N`.

    Raises:
        KeyError: unknown profile. CommandError: unsafe data dir or extra env.
    """
    pool = profiles if profiles is not None else recipe.profiles
    profile = next((p for p in pool if p.id == profile_id), None)
    if profile is None:
        raise KeyError(f"unknown profile {profile_id!r} (known: {', '.join(p.id for p in pool)})")
    root = validate_data_dir(data_dir)
    mounts = tuple(
        MountSpec(str(PurePosixPath(root) / m.source), m.target, m.read_only) for m in recipe.serve.mounts
    )
    cmd = recipe.command(profile)
    additions: list[tuple[str, str]] = []
    name = recipe.serve.container_name
    if not plain:
        name = managed_container_name(recipe, profile)
        if gpu:
            name = f"{name[: CONTAINER_NAME_MAX - 8]}-gpu{gpu}"
        additions.append((f"--name {name}", "one container name per profile, so a switch never reuses a name"))
        wanted: list[tuple[str, str, str]] = []
        if not cmd.has_env(TRACE_ENV):
            wanted.append((TRACE_ENV, "1", "the card's own verification advice; pool-coverage telemetry reads the [delta] tick lines"))
        if recipe.simulated and profile.decode and not cmd.has_env(SIM_DECODE_ENV):
            wanted.append((SIM_DECODE_ENV, f"{profile.decode.value:g}", "simulated engine decodes at the profile's measured speed"))
        for k, v in (extra_env or {}).items():
            if not ENV_NAME_RE.fullmatch(k):
                raise CommandError(f"env name {k!r} must match [A-Z0-9_]+")
            _single_line(v, f"env {k}")
            wanted.append((k, v, "panel setting"))
        for k, v, why in wanted:
            cmd = cmd.remove_env(k).set_env(k, v)  # the panel's additions go last (docker: the last -e wins)
            additions.append((f"-e {k}={v}", why))
    socket_mount: MountSpec | None = None
    if not plain and recipe.serve.listen == "uds":
        # the engine on a unix socket (issue 40): any --host goes (vLLM ignores host and port with --uds); custom
        # profiles cannot set --host, --port or --uds (schema.PINNED_FLAGS)
        try:
            sock = engine_endpoint(recipe, root, gpu).uds
        except EndpointError as exc:
            raise CommandError(str(exc)) from None
        sock_dir = str(PurePosixPath(sock).parent)
        socket_mount = MountSpec(sock_dir, sock_dir, False)
        mounts = (*mounts, socket_mount)
        cmd = cmd.remove_arg("--host").remove_arg("--uds").set_arg("--uds", sock)
        additions.append((f"-v {sock_dir}:{sock_dir}", MOUNT_WHY))
        additions.append((f"--uds {sock}", UDS_WHY))
    elif not plain:
        # an existing --host is replaced: a recipe cannot open the engine to the network through the panel;
        # custom profiles cannot set --host at all (schema.PINNED_FLAGS)
        cmd = cmd.remove_arg("--host").set_arg("--host", ENGINE_BIND_HOST)
        additions.append((f"--host {ENGINE_BIND_HOST}", HOST_WHY))
        if gpu:
            port = engine_endpoint(recipe, root, gpu).port
            cmd = cmd.remove_arg("--port").set_arg("--port", str(port))
            additions.append((f"--port {port}", f"GPU {gpu}'s engine: the recipe's port + {gpu}"))
    gpus = recipe.serve.gpus
    if gpu is not None and gpus and not plain:
        gpus = f'"device={gpu}"'
        additions.append((f"--gpus {gpus}", f"one engine per GPU: this one runs on GPU {gpu}"))
    spec = RunSpec(
        name=name,
        image=image or recipe.engine.image,
        gpus=gpus,
        network=recipe.serve.network,
        ipc=recipe.serve.ipc,
        shm_size=recipe.serve.shm_size,
        mounts=mounts,
        env=cmd.env,
        args=cmd.args,
        socket_mount=socket_mount,
    )
    if plain:
        return spec
    labels = (
        (f"{LABEL_PREFIX}.managed", "1"),
        (f"{LABEL_PREFIX}.recipe", recipe.id),
        (f"{LABEL_PREFIX}.profile", profile.id),
        (f"{LABEL_PREFIX}.config-hash", config_hash(spec)),
        (f"{LABEL_PREFIX}.simulated", "1" if recipe.simulated else "0"),
    ) + (((f"{LABEL_PREFIX}.build", build),) if build else ()) + (((GPU_LABEL, str(gpu)),) if gpu is not None else ())
    additions.append(("--label moet-panel.*=…", "ownership labels: the panel finds and adopts only its own containers"))
    return RunSpec(**{**asdict(spec), "mounts": mounts, "labels": labels, "additions": tuple(additions),
                      "socket_mount": socket_mount})


def render_shell(spec: RunSpec) -> str:
    """Card-style multi-line shell text; every value quoted with shlex."""
    lines: list[str] = [f"# {opt}  — added by moet-panel: {why}" for opt, why in spec.additions]
    body = [" ".join(shlex.quote(x) for x in spec.head())]
    body += [f"  {flag} {shlex.quote(value)}" for flag, value in spec.option_pairs()]
    body.append(f"  {shlex.quote(spec.image)}")
    body += [f"  {text}" for _, text in _arg_chunks(spec)]
    return "\n".join(lines + [" \\\n".join(body)])


def render_json(spec: RunSpec) -> str:
    payload = asdict(spec)
    payload["argv"] = spec.argv()
    payload["additions"] = [{"option": o, "why": w} for o, w in spec.additions]
    return json.dumps(payload, indent=2)


@dataclass(frozen=True)
class ExplainedLine:
    """One line of the card-style command with its reason: the card's "why each knob" line, or the panel's."""

    text: str  # the line as render_shell prints it (without the trailing backslash)
    why: str  # the reason, or "" where the card gives none
    source: str  # "card", "panel" or "" (no reason given)


def _arg_chunks(spec: RunSpec) -> list[tuple[str, str]]:
    """(flag, shell text) for each engine argument with its value: one line of the card-style command each."""
    return [(flag, shlex.quote(flag) if value is None else f"{flag} {shlex.quote(value)}")
            for flag, value in spec.command.arg_items()]


def explain_lines(recipe: Recipe, spec: RunSpec) -> list[ExplainedLine]:
    """Every line of `render_shell(spec)` beside its reason (issue 16: every knob's reason at hand)."""
    panel = {opt.split("=", 1)[0].removeprefix("-e ").strip(): why for opt, why in spec.additions if opt.startswith("-e ")}
    named = [why for opt, why in spec.additions if opt.startswith("--name ")]
    head = " ".join(shlex.quote(x) for x in spec.head())
    out = [ExplainedLine(head, f"added by moet-panel (--name): {named[0]}", "panel") if named else ExplainedLine(head, "", "")]
    for flag, value in spec.option_pairs():
        text = f"{flag} {shlex.quote(value)}"
        if flag == "-e":
            name = value.split("=", 1)[0]
            if name in panel:
                out.append(ExplainedLine(text, f"added by moet-panel: {panel[name]}", "panel"))
            elif name in recipe.why:
                out.append(ExplainedLine(text, recipe.why[name], "card"))
            else:
                out.append(ExplainedLine(text, "", ""))
        elif flag == "-v" and spec.socket_mount is not None and value.split(":", 1)[0] == spec.socket_mount.source:
            out.append(ExplainedLine(text, f"added by moet-panel: {MOUNT_WHY}", "panel"))
        elif flag == "--label":
            out.append(ExplainedLine(text, "added by moet-panel: ownership labels: the panel finds and adopts only its own "
                                            "containers", "panel"))
        else:
            out.append(ExplainedLine(text, "", ""))
    out.append(ExplainedLine(shlex.quote(spec.image), "", ""))
    panel_args = {opt.split(" ", 1)[0]: why for opt, why in spec.additions if opt.startswith(("--host ", "--uds "))}
    for flag, text in _arg_chunks(spec):
        if flag in panel_args:
            out.append(ExplainedLine(text, f"added by moet-panel: {panel_args[flag]}", "panel"))
            continue
        if flag == "--port" and "--uds" in panel_args:
            out.append(ExplainedLine(text, PORT_IGNORED_WHY, "panel"))
            continue
        why = recipe.why.get(flag, "")
        out.append(ExplainedLine(text, why, "card" if why else ""))
    return out


def render_explained(recipe: Recipe, spec: RunSpec) -> str:
    """The command one line at a time, each followed by its reason (for reading; copy the plain output to run)."""
    lines = [
        "# Why each line: the card's own words (docs/model-card.txt), or why moet-panel adds it.",
        "# For reading only: the reasons break the line continuation; run `moet-panel command` without --explain.",
    ]
    for e in explain_lines(recipe, spec):
        lines.append(e.text if e.text.startswith("docker ") else f"  {e.text}")
        why = e.why if e.source == "panel" else (f"card: {e.why}" if e.why else f"({NO_REASON})")
        lines.append(f"      ↳ {why}")
    return "\n".join(lines)
