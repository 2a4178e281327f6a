"""Docker implementation of the engine runtime (docker-py 7; docs/engine.md, "Engine facts").

Pitfalls handled here: the client comes from the environment (DOCKER_HOST works); a dead daemon
raises DockerException at construction but `requests` exceptions later (both -> RuntimeUnavailable);
never `remove=True` (auto_remove loses the exit code / OOMKilled); `--gpus` maps to a DeviceRequest;
logs are write-sized chunks with stdout/stderr interleaved -> one follow stream per stream, each with
its own line buffer; a missing image is reported, never pulled (there is no registry here).
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Callable
from typing import Literal, Protocol, TypeVar

import docker
import requests
from docker.types.daemon import CancellableStream

from app.backend.contracts import JsonObject
from app.backend.config import env
from app.backend.engine.errlog import ENGINE_ERRORS
from app.backend.engine.runtime.base import (
    Instance,
    LineSink,
    LineSplitter,
    RuntimeOpError,
    RuntimeUnavailable,
    Stream,
)
from app.backend.recipe.command import RunSpec
from app.backend.recipe.endpoint import ensure_socket_dir

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
T = TypeVar("T")
_TRANSPORT_ERRORS = (requests.exceptions.RequestException, ConnectionError, OSError)


def docker_host() -> str:
    return env.docker_host() or DEFAULT_SOCKET


def unreachable_message(why: object) -> str:
    text = str(why).strip().splitlines()[0] if str(why).strip() else type(why).__name__
    return (
        f"Docker daemon unreachable at {docker_host()}: {text}; "
        "is dockerd running / are you in the docker group?"
    )


def gpu_device_requests(gpus: str) -> list[docker.types.DeviceRequest]:
    """docker CLI `--gpus` value -> DeviceRequest (docker/cli opts/gpus.go semantics)."""
    value = gpus.strip().strip('"').strip("'")
    if not value:
        return []
    if value == "all":
        return [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if value.isdigit():
        return [docker.types.DeviceRequest(count=int(value), capabilities=[["gpu"]])]
    if value.startswith("device="):
        ids = [x for x in value.removeprefix("device=").split(",") if x]
        return [docker.types.DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]
    raise RuntimeOpError(f"unsupported --gpus value {gpus!r}", reason="bad_spec")


class _Closeable(Protocol):
    def close(self) -> None: ...


class _Follow:
    """Two follow streams (stdout, stderr) of one container; close() cancels both."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: list[_Closeable] = []
        self._closed = False
        self.threads: list[threading.Thread] = []

    def register(self, stream: _Closeable) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._streams.append(stream)
            return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            streams, self._streams = self._streams, []
        for s in streams:
            try:
                s.close()
            except Exception as exc:  # already closed by the daemon
                ENGINE_ERRORS.caught("closing a Docker log stream", exc, level=logging.DEBUG)

    @property
    def closed(self) -> bool:
        return self._closed


class DockerRuntime:
    kind: Literal["docker", "process"] = "docker"

    def __init__(self, client: docker.DockerClient | None = None, timeout: int = 30) -> None:
        self._client = client
        self._timeout = timeout
        self._lock = threading.Lock()

    # -- client / errors -------------------------------------------------------------------
    @property
    def client(self) -> docker.DockerClient:
        with self._lock:
            if self._client is None:
                try:
                    self._client = docker.from_env(timeout=self._timeout)
                except (docker.errors.DockerException, *_TRANSPORT_ERRORS) as exc:
                    raise RuntimeUnavailable(unreachable_message(exc)) from None
            return self._client

    def _api(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        try:
            return fn(*args, **kwargs)
        except docker.errors.NotFound:
            raise
        except docker.errors.APIError as exc:
            raise RuntimeOpError(f"Docker refused: {exc.explanation or exc}", reason=_reason_of(exc)) from None
        except (docker.errors.DockerException, *_TRANSPORT_ERRORS) as exc:
            raise RuntimeUnavailable(unreachable_message(exc)) from None

    def describe(self) -> str:
        return f"Docker at {docker_host()}"

    def check(self) -> None:
        self._api(self.client.ping)

    def info(self) -> dict[str, object]:
        raw = self._api(self.client.info)
        return {
            "version": raw.get("ServerVersion", ""),
            "runtimes": sorted((raw.get("Runtimes") or {}).keys()),
            "default_runtime": raw.get("DefaultRuntime", ""),
            "cdi_spec_dirs": list(raw.get("CDISpecDirs") or []),
        }

    def image_present(self, image: str) -> bool:
        try:
            self._api(self.client.api.inspect_image, image)
            return True
        except docker.errors.NotFound:
            return False

    def image_id(self, image: str) -> str:
        # a rebuilt image keeps its tag but not its id: the self-test keys its results by the id
        try:
            return str(self._api(self.client.api.inspect_image, image).get("Id", ""))
        except docker.errors.NotFound:
            return ""

    # -- instances ---------------------------------------------------------------------------
    def get(self, name_or_id: str) -> Instance | None:
        try:
            raw = self._api(self.client.api.inspect_container, name_or_id)
        except docker.errors.NotFound:
            return None
        return _instance(raw)

    def events(self, labels: dict[str, str]) -> CancellableStream[JsonObject]:
        """Docker's event stream for containers with these labels (docker-py CancellableStream; close() ends
        it). Used by the controller's watch to see outside starts/stops/kills within a second."""
        flt = {"type": "container", "label": [f"{k}={v}" for k, v in labels.items()]}
        return self._api(self.client.events, decode=True, filters=flt)

    def list(self, labels: dict[str, str], include_stopped: bool = True) -> builtins.list[Instance]:
        flt = {"label": [f"{k}={v}" for k, v in labels.items()]}
        rows = self._api(self.client.api.containers, all=include_stopped, filters=flt)
        out = [self.get(r["Id"]) for r in rows]
        return [i for i in out if i is not None]

    def run(self, spec: RunSpec, extra_labels: dict[str, str] | None = None) -> Instance:
        if not self.image_present(spec.image):
            raise RuntimeOpError(f"image {spec.image} is not present on this Docker host", reason="image_missing")
        if spec.socket_mount is not None:  # the engine socket's dir: 0700 and ours, before Docker makes it root 0755
            ensure_socket_dir(spec.socket_mount.source)
        kwargs: JsonObject = {
            "image": spec.image,
            "command": list(spec.args),
            "name": spec.name,
            "detach": True,
            "environment": spec.env_dict,
            "labels": {**spec.labels_dict, **(extra_labels or {})},
            "volumes": {m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts},
        }
        if spec.network:
            kwargs["network_mode"] = spec.network
        if spec.ipc:
            kwargs["ipc_mode"] = spec.ipc
        if spec.shm_size:
            kwargs["shm_size"] = spec.shm_size
        if spec.gpus:
            kwargs["device_requests"] = gpu_device_requests(spec.gpus)
        container = self._api(self.client.containers.create, **kwargs)
        try:
            self._api(container.start)
        except RuntimeOpError:
            self._api(container.remove, force=True)  # created-but-unstartable: don't leave it behind
            raise
        inst = self.get(container.id or spec.name)  # docker-py types the id optional; a created one has it
        if inst is None:
            raise RuntimeOpError(f"container {spec.name} vanished right after start", reason="unexpected_exit")
        return inst

    def stop(self, ident: str, grace_s: float) -> Instance | None:
        try:
            self._api(self.client.api.stop, ident, timeout=max(1, int(round(grace_s))))
        except docker.errors.NotFound:
            return None
        return self.get(ident)

    def kill(self, ident: str) -> None:
        try:
            self._api(self.client.api.kill, ident)
        except (docker.errors.NotFound, RuntimeOpError):
            pass  # already gone / not running

    def remove(self, ident: str) -> None:
        try:
            self._api(self.client.api.remove_container, ident, force=True)
        except docker.errors.NotFound:
            pass

    def wait(self, ident: str, timeout_s: float) -> Instance | None:
        try:
            self._api(self.client.api.wait, ident, timeout=timeout_s)
        except docker.errors.NotFound:
            return None
        except RuntimeUnavailable:
            pass  # ReadTimeout while waiting: still running; report the current state
        return self.get(ident)

    def pids(self, ident: str) -> set[int]:
        try:
            top = self._api(self.client.api.top, ident)
        except (docker.errors.NotFound, RuntimeOpError):
            return set()
        col = top.get("Titles", []).index("PID") if "PID" in top.get("Titles", []) else 0
        return {int(row[col]) for row in top.get("Processes") or [] if str(row[col]).isdigit()}

    # -- logs --------------------------------------------------------------------------------
    def follow_logs(self, ident: str, sink: LineSink, *, from_start: bool = True, tail: int = 300) -> _Follow:
        follow = _Follow()
        for stream in ("stdout", "stderr"):
            t = threading.Thread(
                target=self._pump, args=(ident, stream, sink, follow, "all" if from_start else tail),
                name=f"engine-logs-{stream}-{ident[:12]}", daemon=True,
            )
            follow.threads.append(t)
            t.start()
        return follow

    def _pump(self, ident: str, stream: Stream, sink: LineSink, follow: _Follow, tail: Literal["all"] | int) -> None:
        splitter = LineSplitter()
        try:
            gen = self.client.api.logs(
                ident, stdout=stream == "stdout", stderr=stream == "stderr", stream=True, follow=True, tail=tail
            )
            if not follow.register(gen):
                gen.close()
                return
            for chunk in gen:
                for line in splitter.feed(chunk):
                    sink(stream, line)
            for line in splitter.flush():
                sink(stream, line)
        except Exception as exc:  # cancelled by close(), container removed, daemon gone: the stream just ends
            ENGINE_ERRORS.caught(f"following the {stream} log", exc, level=logging.DEBUG)
        finally:
            sink(stream, None)

    def read_logs(self, ident: str, *, max_lines: int = 50000) -> builtins.list[tuple[Stream, str]]:
        out: list[tuple[Stream, str]] = []
        for stream in ("stdout", "stderr"):
            splitter = LineSplitter()
            try:
                gen = self.client.api.logs(ident, stdout=stream == "stdout", stderr=stream == "stderr", stream=True,
                                           follow=False)  # docker-py: follow defaults to stream
                n = 0
                for chunk in gen:
                    lines = splitter.feed(chunk)
                    out += [(stream, ln) for ln in lines]
                    n += len(lines)
                    if n >= max_lines:
                        gen.close()
                        break
                out += [(stream, ln) for ln in splitter.flush()]
            except (docker.errors.DockerException, *_TRANSPORT_ERRORS):
                continue
        return out

    def tail_logs(self, ident: str, lines: int) -> builtins.list[tuple[Stream, str]]:
        out: list[tuple[Stream, str]] = []
        for stream in ("stdout", "stderr"):
            splitter = LineSplitter()
            try:
                raw = self.client.api.logs(ident, stdout=stream == "stdout", stderr=stream == "stderr", stream=False,
                                           follow=False, tail=max(int(lines), 0))
            except docker.errors.NotFound:
                continue  # the run is gone: it has no log to show
            except (docker.errors.DockerException, *_TRANSPORT_ERRORS) as exc:
                # not read is not empty: the boot's pool gate once stopped a good engine as "pool not loaded" on a
                # tail a loaded daemon did not answer (docs/engine.md, the pool gate under "Ready")
                raise RuntimeUnavailable(f"Docker did not return the engine's {stream}: {type(exc).__name__}") from exc
            out += [(stream, ln) for ln in splitter.feed(raw) + splitter.flush()]
        return out


def _reason_of(exc: docker.errors.APIError) -> str:
    text = str(exc.explanation or exc)
    if exc.status_code == 409 and "already in use" in text:
        return "name_conflict"
    if "No such image" in text or "pull access denied" in text:
        return "image_missing"
    if "address already in use" in text:
        return "port_in_use"
    return ""


def _instance(raw: JsonObject) -> Instance:
    state = raw.get("State") or {}
    config = raw.get("Config") or {}
    env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
    status = state.get("Status", "")
    return Instance(
        id=raw.get("Id", ""),
        name=(raw.get("Name") or "").lstrip("/"),
        status=status,
        labels=dict(config.get("Labels") or {}),
        env=env,
        exit_code=None if status in ("running", "created", "restarting") else state.get("ExitCode"),
        oom_killed=bool(state.get("OOMKilled")),
        started_at=state.get("StartedAt", ""),
        image=config.get("Image", ""),
        error=state.get("Error", "") or "",
        finished_at="" if status == "running" or (state.get("FinishedAt") or "").startswith("0001") else
        state.get("FinishedAt", ""),
    )
