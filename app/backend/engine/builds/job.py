"""Build the engine source at a commit into an image the panel holds (`moet-panel engine build-image --commit REF`).

The tree at REF is exported (`git archive`, so the owner's checkout is never touched) from `--source DIR` or
from the panel's own clone of the recipe's engine source (`<state>/engine-src`, needs network once), built
with the recipe's Dockerfile at low priority (the classic builder runs its steps with a small CPU share; the
engine keeps serving) and recorded in the build registry (engine/builds/store.py). Demo mode builds the SIMULATED
engine's image variant instead (simengine/image.py). docs/engine.md "Upgrading the engine".
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from app.backend import oplog
from app.backend.engine.builds import store as builds
from app.backend.config import env
from app.backend.engine.runtime.docker import DockerRuntime
from app.backend.engine.runtime.base import RuntimeUnavailable
from app.backend.engine.builds.image import BuildEvent, BuildResult, ImageBuildRefused, build_image, build_mark
from app.backend.files.atomic import LockBusy
from app.backend.jobs import BackgroundJob, JobState
from app.backend.config.settings import Settings

GIT_TIMEOUT_S = 600


@dataclass(frozen=True)
class BuildOutcome:
    result: BuildResult
    build: builds.Build | None


def _git(args: list[str], cwd: Path | None = None, timeout: float = GIT_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    if shutil.which("git") is None:
        raise ImageBuildRefused("git is not installed: `apt-get install git`")
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def source_repo(settings: Settings, source: Path | None, on_event: Callable[[BuildEvent], None]) -> Path:
    """The git checkout to read REF from: --source, else the panel's clone of the recipe's engine source."""
    if source is not None:
        src = source.expanduser().resolve()
        if not (src / ".git").exists() and _git(["-C", str(src), "rev-parse", "--git-dir"]).returncode != 0:
            raise ImageBuildRefused(f"--source {src} is not a git checkout of the engine source")
        return src
    clone = settings.state_dir / "engine-src"
    url = settings.recipe.engine.repo_url
    if (clone / ".git").exists() or (clone / "HEAD").exists():
        on_event(BuildEvent(f"$ git -C {clone} fetch origin"))
        _git(["-C", str(clone), "fetch", "--quiet", "origin"])  # offline: the refs already fetched still serve
        return clone
    on_event(BuildEvent(f"$ git clone {url} {clone}"))
    done = _git(["clone", "--quiet", url, str(clone)])
    if done.returncode != 0:
        raise ImageBuildRefused(f"cannot clone {url} ({done.stderr.strip()[:200]}): without network, clone it on a "
                                "machine that has it, copy the checkout here and pass --source DIR")
    return clone


def resolve_commit(repo: Path, ref: str) -> str:
    out = _git(["-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"])
    if out.returncode != 0 or not out.stdout.strip():
        raise ImageBuildRefused(f"{ref!r} is not a commit of {repo} (a branch, tag or hash; `git -C {repo} fetch` "
                                "first when it is new)")
    return out.stdout.strip()


def export_tree(repo: Path, commit: str, dest: Path) -> None:
    """The tree at `commit` into `dest` (git archive | tar -x in Python: no shell)."""
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(["git", "-C", str(repo), "archive", "--format=tar", commit], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        tar.extractall(dest, filter="data")
    if proc.wait(timeout=GIT_TIMEOUT_S) != 0:
        raise ImageBuildRefused(f"git archive {commit[:12]} failed")


def build_commit(settings: Settings, ref: str, source: Path | None, on_event: Callable[[BuildEvent], None],
                 dockerfile: str | None = None, tag: str | None = None) -> BuildOutcome:
    """Build the engine source at `ref`; the image is tagged with the commit and recorded as build <commit:7>."""
    eng = settings.recipe.engine
    repo = source_repo(settings, source, on_event)
    commit = resolve_commit(repo, ref)
    build_id = commit[:7]
    image = tag or builds.image_tag(eng.image, build_id)
    dockerfile = dockerfile or eng.dockerfile
    with tempfile.TemporaryDirectory(prefix="engine-src-", dir=settings.ensure_state_dir()) as tmp:
        tree = Path(tmp) / "src"
        on_event(BuildEvent(f"exporting {commit[:12]} from {repo}"))
        export_tree(repo, commit, tree)
        if not (tree / dockerfile).is_file():
            raise ImageBuildRefused(f"commit {commit[:12]} has no {dockerfile}")
        result = build_image(tree, dockerfile, image, dict(eng.build_env), on_event, low_priority=True)
    if not result.ok:
        return BuildOutcome(result, None)
    b = builds.Build(build_id, commit, image, settings.recipe.id, time.time(), image_size(image),
                     source=str(repo))
    builds.registry(settings).add(b)
    return BuildOutcome(result, b)


def build_demo(settings: Settings, variant: str, on_event: Callable[[BuildEvent], None]) -> BuildOutcome:
    """The SIMULATED build `variant` (e.g. `next`): the simulated engine's image with that variant baked in; without
    Docker (the demo's process runtime, engine/runtime/choice.py) the variant is recorded with no image and its engine
    process gets it in its environment (process_runtime.py), as the SIMULATED engine itself runs (issue 49)."""
    from app.backend.simengine import config as sim_config
    from app.backend.simengine import image as sim_image

    if variant not in sim_config.BUILD_VARIANTS or not variant:
        known = ", ".join(v for v in sim_config.BUILD_VARIANTS if v)
        raise ValueError(f"the SIMULATED engine has no build {variant!r} (demo builds: {known})")
    tag = builds.image_tag(settings.recipe.engine.image, variant)
    if not _docker_reachable():
        on_event(BuildEvent(f"no Docker: SIMULATED build {variant} runs as a local process (no image to build)"))
        b = builds.Build(variant, variant, tag, settings.recipe.id, time.time(), None,
                         source="SIMULATED demo variant (local process, no Docker)", simulated=True, variant=variant)
        builds.registry(settings).add(b)
        return BuildOutcome(BuildResult(True, tag, f"recorded SIMULATED build {variant} (local process runtime: no "
                                        "Docker, no image)", "process"), b)
    try:
        sim_image.ensure_image(tag=tag, variant=variant, progress=lambda line: on_event(BuildEvent(line)))
    except sim_image.ImageBuildError as exc:
        return BuildOutcome(BuildResult(False, tag, str(exc), "docker-py"), None)
    except Exception as exc:  # Docker stopped answering (an explicit DOCKER_HOST): one line, not docker-py's text
        return BuildOutcome(BuildResult(False, tag, f"building the SIMULATED image needs Docker, which does not answer "
                                        f"({type(exc).__name__}; `docker version` says more)", "docker-py"), None)
    b = builds.Build(variant, variant, tag, settings.recipe.id, time.time(), image_size(tag),
                     source="SIMULATED demo variant", simulated=True, variant=variant)
    builds.registry(settings).add(b)
    return BuildOutcome(BuildResult(True, tag, f"built SIMULATED build {variant} ({tag})", "docker-py"), b)


def _docker_reachable() -> bool:
    """Docker answers, or DOCKER_HOST names a daemon (then its error is the user's to see, as in
    runtime/choice.select_runtime: never the process runtime behind an explicit DOCKER_HOST's back)."""
    if env.docker_host():
        return True
    try:
        DockerRuntime().check()
    except RuntimeUnavailable:
        return False
    return True


def image_size(image: str) -> int | None:
    import docker  # docker-py and requests load only when a build asks (start-up time, docs/engine.md)
    import requests

    try:
        size = DockerRuntime().client.images.get(image).attrs.get("Size")
        return int(size) if size is not None else None
    except (RuntimeUnavailable, docker.errors.DockerException, requests.exceptions.RequestException):
        return None  # the size is informational: no Docker, no such image (the build itself said why)


@dataclass(frozen=True)
class BuildProgress:
    state: JobState = JobState.IDLE
    ref: str = ""
    step: str = ""  # "step 3/7" when the builder says so
    last_line: str = ""
    message: str = ""
    build: str = ""  # the build id once done


class BuildService(BackgroundJob[BuildProgress]):
    """The Engine tab's build: one at a time, in the background, its progress polled by the page."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        super().__init__(BuildProgress(), "engine-build")

    def start(self, ref: str, source: Path | None, who: str) -> BuildProgress:
        ref = ref.strip()
        if not ref:
            return BuildProgress(JobState.FAILED, message="give a commit (a branch, tag or hash; `next` in demo mode)")
        first = BuildProgress(JobState.RUNNING, ref, message="building")
        if not self._launch(first, lambda: self._run(ref, source, who)):
            return replace(self.progress(), message="a build is already running")
        oplog.decision("engine", "build-start", who=who, ref=ref)
        return self.progress()

    def _on_event(self, ev: BuildEvent) -> None:
        p = self.progress()
        step = f"step {ev.step[0]}/{ev.step[1]}" if ev.step else p.step
        self._set(replace(p, step=step, last_line=ev.line[:300]))

    def _run(self, ref: str, source: Path | None, who: str) -> None:
        try:
            mark = build_mark(self.settings.ensure_state_dir(), ref)  # acquired: the supervisor waits for the image
            try:
                out = (build_demo(self.settings, ref, self._on_event) if self.settings.recipe.simulated
                       else build_commit(self.settings, ref, source, self._on_event))
            finally:
                mark.release()
        except (ImageBuildRefused, ValueError, LockBusy, OSError) as exc:
            self._set(replace(self.progress(), state=JobState.FAILED, message=str(exc)))
            oplog.caught("engine", exc, f"building {ref}", who=who)
            return
        done = out.result.ok and out.build is not None
        self._set(replace(self.progress(), state=JobState.DONE if done else JobState.FAILED,
                          message=out.result.message, build=out.build.id if out.build else ""))
        oplog.decision("engine", "build", who=who, ref=ref, result="ok" if done else "failed",
                       build=out.build.id if out.build else None, reason=None if done else out.result.message)
