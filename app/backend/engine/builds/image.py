"""Build the engine image from a local checkout of the engine source (`moet-panel engine build-image`).

Two builders, same events: the card builds with DOCKER_BUILDKIT=1, which docker-py cannot speak
(classic builder API only; docs/engine.md "Engine facts"), so BuildKit builds shell out to `docker build` (argument
list, no shell) with `--progress=plain`; otherwise docker-py's low-level build streams JSON events —
which never raise on failure, so every event is checked for "error". That docker-py build
(`docker_py_build`) is the panel's one: the SIMULATED engine image (simengine/image.py) and the tests'
upstream-vLLM image go through it too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from app.backend.config import env
from app.backend.engine.runtime.docker import DockerRuntime, unreachable_message
from app.backend.files.atomic import PidLock

CLASSIC_STEP_RE = re.compile(r"^Step (?P<k>\d+)/(?P<n>\d+) :")
BUILDKIT_STEP_RE = re.compile(r"^#\d+ \[(?:[\w.-]+ )?(?P<k>\d+)/(?P<n>\d+)\]")


@dataclass(frozen=True)
class BuildEvent:
    line: str
    step: tuple[int, int] | None = None  # (k, n) when the line starts a build step
    error: bool = False


@dataclass(frozen=True)
class BuildResult:
    ok: bool
    tag: str
    message: str
    builder: str  # "buildkit-cli" | "docker-py"


class ImageBuildRefused(ValueError):
    """The build cannot start (no source, wrong commit, no network to clone); the message says what to do."""


def check_source(source: Path | None, commit: str, repo_url: str, dockerfile: str, allow_other_commit: bool) -> Path:
    """Validate the checkout: exists, has the Dockerfile, and HEAD is at the recipe's commit."""
    if source is None:
        raise ImageBuildRefused(
            f"no --source given. Cloning needs network access, which this machine does not have: on a machine "
            f"with network run `git clone {repo_url} && git -C vLLM-Moet checkout {commit}`, copy the checkout "
            "here and pass --source DIR."
        )
    src = source.expanduser().resolve()
    if not src.is_dir():
        raise ImageBuildRefused(f"--source {src} is not a directory")
    if not (src / dockerfile).is_file():
        raise ImageBuildRefused(f"{src} has no {dockerfile} (is this a vLLM-Moet checkout?)")
    head = _git_head(src)
    if head is None:
        if not allow_other_commit:
            raise ImageBuildRefused(f"{src} is not a git checkout, so its commit cannot be checked against "
                                    f"{commit}; pass --allow-other-commit to build it anyway")
    elif not head.startswith(commit) and not allow_other_commit:
        raise ImageBuildRefused(f"{src} is at {head[:12]}, the recipe pins {commit}: "
                                f"`git -C {src} checkout {commit}` (or --allow-other-commit)")
    return src


def _git_head(src: Path) -> str | None:
    if shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def build_image(
    source: Path, dockerfile: str, tag: str, build_env: dict[str, str],
    on_event: Callable[[BuildEvent], None], runtime: DockerRuntime | None = None, low_priority: bool = False,
) -> BuildResult:
    """Run the build, streaming every output line to on_event. Never raises for build failures. `low_priority`:
    while an engine serves (docs/engine.md "Upgrading the engine"): the classic builder's step containers get a
    small CPU share; a BuildKit build runs its client under `nice` (BuildKit takes no CPU share per build)."""
    if build_env.get("DOCKER_BUILDKIT") == "1":
        return _build_cli(source, dockerfile, tag, build_env, on_event, low_priority)
    return _build_py(source, dockerfile, tag, on_event, runtime or DockerRuntime(), low_priority)


def _build_cli(source: Path, dockerfile: str, tag: str, build_env: dict[str, str],
               on_event: Callable[[BuildEvent], None], low_priority: bool = False) -> BuildResult:
    docker_bin = shutil.which("docker")
    if docker_bin is None:
        return BuildResult(False, tag, "BuildKit build needs the docker CLI, which is not on PATH", "buildkit-cli")
    argv = [docker_bin, "build", "--progress=plain", "-f", str(source / dockerfile), "-t", tag, str(source)]
    if low_priority and (nice := shutil.which("nice")):
        argv = [nice, "-n", "19", *argv]
    child_env = {**env.whole(), **build_env}
    on_event(BuildEvent("$ " + " ".join(argv)))
    proc = subprocess.Popen(argv, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    last_error = ""
    for raw in proc.stdout:
        line = raw.decode("utf-8", "replace").rstrip()
        m = BUILDKIT_STEP_RE.match(line)
        is_err = "ERROR" in line or line.startswith("error:")
        last_error = line if is_err else last_error
        on_event(BuildEvent(line, (int(m["k"]), int(m["n"])) if m else None, is_err))
    code = proc.wait()
    if code == 0:
        return BuildResult(True, tag, f"built {tag}", "buildkit-cli")
    if "buildx component is missing" in last_error:
        return BuildResult(False, tag, "the recipe builds with BuildKit (DOCKER_BUILDKIT=1) but the docker buildx "
                           "plugin is not installed: `apt-get install docker-buildx` (Debian) or "
                           "docker-buildx-plugin (Docker's repo), then retry", "buildkit-cli")
    return BuildResult(False, tag, f"docker build failed (exit {code}): {last_error or 'see the log'}", "buildkit-cli")


def _build_py(source: Path, dockerfile: str, tag: str, on_event: Callable[[BuildEvent], None],
              runtime: DockerRuntime, low_priority: bool = False) -> BuildResult:
    try:
        api = runtime.client.api
    except Exception as exc:  # RuntimeUnavailable from the client property
        return BuildResult(False, tag, str(exc), "docker-py")
    return docker_py_build(api, source, dockerfile, tag, on_event, low_priority)


LOW_CPU_SHARES = 64  # of Docker's default 1024: a build step yields the CPU to the serving engine


def docker_py_build(api: Any, context: Path, dockerfile: str, tag: str,
                    on_event: Callable[[BuildEvent], None], low_priority: bool = False) -> BuildResult:
    """Build `context` with docker-py's low-level client `api` (classic builder, no pull), every output line
    to on_event. Never raises for build or daemon failures."""
    import docker
    import requests

    try:
        limits = {"cpushares": LOW_CPU_SHARES} if low_priority else None
        events = api.build(path=str(context), dockerfile=dockerfile, tag=tag, rm=True, forcerm=True, pull=False,
                           decode=True, container_limits=limits)
        for ev in events:
            if "error" in ev:  # the low-level API does not raise on build errors
                msg = ((ev.get("errorDetail") or {}).get("message") or ev["error"]).strip()
                on_event(BuildEvent(msg, None, True))
                return BuildResult(False, tag, f"docker build failed: {msg}", "docker-py")
            for line in str(ev.get("stream", "")).splitlines():
                if line.strip():
                    m = CLASSIC_STEP_RE.match(line)
                    on_event(BuildEvent(line, (int(m["k"]), int(m["n"])) if m else None))
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        return BuildResult(False, tag, unreachable_message(exc) if not isinstance(exc, docker.errors.APIError)
                           else f"docker build failed: {exc}", "docker-py")
    except Exception as exc:  # e.g. an unreadable file in the build context
        return BuildResult(False, tag, f"docker build failed: {exc}", "docker-py")
    return BuildResult(True, tag, f"built {tag}", "docker-py")


BUILD_LOCK = "engine-image-build.lock"


def build_mark(state_dir: Path, tag: str) -> PidLock:
    """Held while `moet-panel engine build-image` builds `tag`: the supervisor then treats "image missing" as a
    cause that heals (docs/engine.md "Keeps serving"). A kernel lock: a killed build never leaves it set."""
    return PidLock(Path(state_dir) / BUILD_LOCK).acquire(note=tag)


def image_build_running(state_dir: Path) -> bool:
    """Does a build of the engine image run now (any process on this data dir)?"""
    return PidLock(Path(state_dir) / BUILD_LOCK).holder() is not None

