"""Runtime abstraction: where an engine runs (a Docker container, or a local SIMULATED process).

The controller only talks to a `Runtime`; `DockerRuntime` and `ProcessRuntime` implement it with the
same lifecycle (run a `RunSpec`, list panel-owned instances by label, stop with grace, follow logs
with stdout/stderr apart, report exit code / OOMKilled).
"""

from __future__ import annotations

import builtins

from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Callable, Literal, Protocol

from app.backend.recipe.command import LABEL_PREFIX, RunSpec

MANAGED_LABEL = f"{LABEL_PREFIX}.managed"
RECIPE_LABEL = f"{LABEL_PREFIX}.recipe"
PROFILE_LABEL = f"{LABEL_PREFIX}.profile"
SIMULATED_LABEL = f"{LABEL_PREFIX}.simulated"
TEST_LABEL = f"{LABEL_PREFIX}.test"
BUILD_LABEL = f"{LABEL_PREFIX}.build"  # the engine build it runs (builds/store.py)

Stream = Literal["stdout", "stderr"]
# Called with (stream, text) for every complete line; `None` text = that stream ended.
LineSink = Callable[[Stream, "str | None"], None]


class RuntimeUnavailable(RuntimeError):
    """The runtime cannot be used at all (daemon down, no permission). The message says what to do."""


class RuntimeOpError(RuntimeError):
    """One operation failed (name conflict, image missing...). `reason` is a diagnosis hint."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Instance:
    """One engine container/process as the runtime sees it now."""

    id: str
    name: str
    status: str  # created | running | exited | dead | removing | ...
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    exit_code: int | None = None
    oom_killed: bool = False
    started_at: str = ""
    image: str = ""
    error: str = ""  # Docker's State.Error (e.g. an OCI runtime failure)
    finished_at: str = ""  # ISO time the run ended ('' while running)

    @property
    def running(self) -> bool:
        return self.status in ("running", "restarting", "created")

    @property
    def managed(self) -> bool:
        return self.labels.get(MANAGED_LABEL) == "1"

    @property
    def profile_id(self) -> str:
        return self.labels.get(PROFILE_LABEL, "")


class LogFollow(Protocol):
    def close(self) -> None: ...


class EventStream(Protocol):
    """A runtime's stream of container events (docker-py's CancellableStream): close() ends it."""

    def __iter__(self) -> Iterator[dict[str, object]]: ...

    def close(self) -> None: ...


class Runtime(Protocol):
    kind: Literal["docker", "process"]

    def describe(self) -> str:
        """Short human description, e.g. 'Docker 20.10.24 at unix:///var/run/docker.sock'."""
        ...

    def check(self) -> None:
        """Raise RuntimeUnavailable with a clear sentence if this runtime cannot be used."""
        ...

    def info(self) -> dict[str, object]:
        """Daemon facts for preflight: {'runtimes': [...], 'cdi_spec_dirs': [...], 'version': str}."""
        ...

    def image_present(self, image: str) -> bool: ...

    def image_id(self, image: str) -> str:
        """The content id (sha256:...) an image name resolves to now; '' when unknown or there is no image."""
        ...

    def list(self, labels: dict[str, str], include_stopped: bool = True) -> builtins.list[Instance]: ...

    def get(self, name_or_id: str) -> Instance | None: ...

    def run(self, spec: RunSpec, extra_labels: dict[str, str] | None = None) -> Instance:
        """Create and start; never auto-remove (the exit code and OOMKilled must survive)."""
        ...

    def stop(self, ident: str, grace_s: float) -> Instance | None:
        """SIGTERM, wait up to grace_s, then SIGKILL; returns the final state."""
        ...

    def kill(self, ident: str) -> None: ...

    def remove(self, ident: str) -> None: ...

    def wait(self, ident: str, timeout_s: float) -> Instance | None: ...

    def follow_logs(self, ident: str, sink: LineSink, *, from_start: bool = True, tail: int = 300) -> LogFollow:
        """Follow stdout and stderr (kept apart) in background threads until the engine exits or close()."""
        ...

    def read_logs(self, ident: str, *, max_lines: int = 50000) -> builtins.list[tuple[Stream, str]]:
        """The run's log from the beginning (bounded), stdout then stderr; for re-deriving boot state."""
        ...

    def tail_logs(self, ident: str, lines: int) -> builtins.list[tuple[Stream, str]]:
        """The last `lines` lines of stdout, then of stderr; for seeding figures of a run already going."""
        ...

    def pids(self, ident: str) -> set[int]: ...

    def events(self, labels: dict[str, str]) -> EventStream | None:
        """Container events for these labels, or None where the runtime has none (the process runtime): the
        controller then re-reads on its timer only."""
        ...


class LineSplitter:
    """Write-sized byte chunks -> complete text lines (docker logs are chunks, not lines)."""

    def __init__(self) -> None:
        import codecs

        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buf = ""

    def feed(self, chunk: bytes) -> list[str]:
        self._buf += self._decoder.decode(chunk)
        if "\n" not in self._buf:
            if len(self._buf) > 1 << 20:  # a 1 MiB line without newline: flush it rather than grow forever
                out, self._buf = self._buf, ""
                return [out]
            return []
        *lines, self._buf = self._buf.split("\n")
        return [ln.rstrip("\r") for ln in lines]

    def flush(self) -> list[str]:
        rest = self._buf + self._decoder.decode(b"", final=True)
        self._buf = ""
        return [rest.rstrip("\r")] if rest else []
