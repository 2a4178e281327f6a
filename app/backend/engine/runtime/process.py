"""SIMULATED-engine runtime as a local subprocess (demo mode when Docker is not usable).

Same lifecycle as Docker: a `RunSpec` becomes `python -m app.backend.simengine <engine args>` with
the spec's env; stdout/stderr go to separate files (so they stay apart and survive a panel restart);
a small JSON registry under `<state_dir>/engine-procs/` plays the role of container labels, so a
restarted panel re-adopts a running simulated engine instead of starting a second one.
"""

from __future__ import annotations

import builtins
import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Literal, TypedDict

import psutil

from app.backend.config import env
from app.backend.engine.runtime.base import BUILD_LABEL
from app.backend.engine.runtime.base import Instance, LineSink, LineSplitter, RuntimeOpError, Stream
from app.backend.recipe.command import RunSpec
from app.backend.recipe.endpoint import ensure_socket_dir
from app.backend.simengine.config import BUILD_VARIANTS

class Record(TypedDict, total=False):
    """One engine process's registry entry (a JSON file; entries written by older panels may lack keys)."""

    id: str
    name: str
    pid: int
    create_time: float
    labels: dict[str, str]
    env: dict[str, str]
    started_at: str
    stdout: str
    stderr: str
    exit_code: int | None

REPO_ROOT = Path(__file__).resolve().parents[3]
SIM_MODULE = "app.backend.simengine"


class _FileFollow:
    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def close(self) -> None:
        self.stop.set()


class ProcessRuntime:
    kind: Literal["docker", "process"] = "process"

    def __init__(self, state_dir: Path, python: str = sys.executable) -> None:
        self._dir = Path(state_dir) / "engine-procs"
        self._python = python
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def describe(self) -> str:
        return "local process (SIMULATED engine, no Docker)"

    def check(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)

    def info(self) -> dict[str, object]:
        return {"version": "process", "runtimes": [], "cdi_spec_dirs": []}

    def image_present(self, image: str) -> bool:
        return True  # the simulated engine is this package; there is no image

    def image_id(self, image: str) -> str:
        return ""  # no image: the self-test falls back to the name

    # -- registry --------------------------------------------------------------------------
    def _record_path(self, ident: str) -> Path:
        return self._dir / f"{ident}.json"

    def _records(self) -> list[Record]:
        if not self._dir.is_dir():
            return []
        out = []
        for p in sorted(self._dir.glob("*.json")):
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def _find(self, name_or_id: str) -> Record | None:
        recs = [r for r in self._records() if name_or_id in (r.get("id"), r.get("name"))]
        return recs[-1] if recs else None

    def _status(self, rec: Record) -> tuple[str, int | None]:
        ident = str(rec["id"])
        with self._lock:
            proc = self._procs.get(ident)
        if proc is not None:
            code = proc.poll()
            if code is None:
                return "running", None
            return "exited", 128 - code if code < 0 else code  # -9 -> 137, as Docker reports
        if (exit_code := rec.get("exit_code")) is not None:
            return "exited", int(exit_code)
        try:
            p = psutil.Process(int(rec["pid"]))
            if abs(p.create_time() - float(rec["create_time"])) < 1 and p.status() != psutil.STATUS_ZOMBIE:
                return "running", None
        except (psutil.Error, KeyError, ValueError):
            pass
        return "exited", None  # adopted process gone: exit code unknown

    def _instance(self, rec: Record) -> Instance:
        status, code = self._status(rec)
        return Instance(
            id=str(rec["id"]), name=str(rec["name"]), status=status, labels=dict(rec.get("labels") or {}),
            env=dict(rec.get("env") or {}), exit_code=code, started_at=str(rec.get("started_at", "")),
            image="(process)",
        )

    def get(self, name_or_id: str) -> Instance | None:
        rec = self._find(name_or_id)
        return self._instance(rec) if rec else None

    def list(self, labels: dict[str, str], include_stopped: bool = True) -> builtins.list[Instance]:
        out = []
        for rec in self._records():
            rl = rec.get("labels") or {}
            if all(rl.get(k) == v for k, v in labels.items()):
                inst = self._instance(rec)
                if include_stopped or inst.running:
                    out.append(inst)
        return out

    # -- lifecycle ---------------------------------------------------------------------------
    def run(self, spec: RunSpec, extra_labels: dict[str, str] | None = None) -> Instance:
        self.check()
        existing = self.get(spec.name)
        if existing is not None and existing.running:
            raise RuntimeOpError(f"a process named {spec.name} is already running", reason="name_conflict")
        if existing is not None:
            self.remove(existing.id)
        if spec.socket_mount is not None:  # the engine socket's dir, 0700 (docs/engine.md, "Where the engine listens")
            ensure_socket_dir(spec.socket_mount.source)
        ident = f"{spec.name}-{int(time.time() * 1000)}"
        out_path, err_path = self._dir / f"{ident}.stdout", self._dir / f"{ident}.stderr"
        child_env = env.inherited(("PATH", "HOME", "LANG", "TZ"))
        child_env.update(spec.env_dict)
        child_env["PYTHONUNBUFFERED"] = "1"
        variant = spec.labels_dict.get(BUILD_LABEL, "")
        if variant in BUILD_VARIANTS and variant:  # a SIMULATED build: Docker bakes it into an image; a process has
            child_env.setdefault("MOET_SIM_BUILD", variant)  # none, so it goes in the env (buildjob.build_demo)
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                [self._python, "-m", SIM_MODULE, *spec.args], cwd=REPO_ROOT, env=child_env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
            )
        with self._lock:
            self._procs[ident] = proc
        rec: Record = {
            "id": ident, "name": spec.name, "pid": proc.pid, "create_time": psutil.Process(proc.pid).create_time(),
            "labels": {**spec.labels_dict, **(extra_labels or {})}, "env": spec.env_dict,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "stdout": str(out_path), "stderr": str(err_path), "exit_code": None,
        }
        self._record_path(ident).write_text(json.dumps(rec))
        return self._instance(rec)

    def _signal(self, rec: Record, sig: int) -> None:
        try:
            os.killpg(int(rec["pid"]), sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _remember_exit(self, rec: Record) -> None:
        status, code = self._status(rec)
        if status == "exited" and code is not None:
            rec["exit_code"] = code
            self._record_path(str(rec["id"])).write_text(json.dumps(rec))

    def stop(self, ident: str, grace_s: float) -> Instance | None:
        rec = self._find(ident)
        if rec is None:
            return None
        if self._instance(rec).running:
            self._signal(rec, signal.SIGTERM)
            if self.wait(ident, grace_s) is not None and self._instance(rec).running:
                self._signal(rec, signal.SIGKILL)
                self.wait(ident, 10)
        self._remember_exit(rec)
        return self._instance(rec)

    def kill(self, ident: str) -> None:
        rec = self._find(ident)
        if rec is not None:
            self._signal(rec, signal.SIGKILL)

    def remove(self, ident: str) -> None:
        rec = self._find(ident)
        if rec is None:
            return
        if self._instance(rec).running:
            self._signal(rec, signal.SIGKILL)
            self.wait(ident, 10)
        with self._lock:
            self._procs.pop(str(rec["id"]), None)
        for key in ("stdout", "stderr"):
            Path(str(rec[key])).unlink(missing_ok=True)
        self._record_path(str(rec["id"])).unlink(missing_ok=True)

    def wait(self, ident: str, timeout_s: float) -> Instance | None:
        rec = self._find(ident)
        if rec is None:
            return None
        deadline = time.monotonic() + timeout_s
        while self._instance(rec).running and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a pid: there is no wait() for a process we did not start
        self._remember_exit(rec)
        return self._instance(rec)

    def events(self, labels: dict[str, str]) -> None:
        """No event stream for local processes: the controller re-reads on its timer."""
        return None

    def pids(self, ident: str) -> set[int]:
        rec = self._find(ident)
        if rec is None or not self._instance(rec).running:
            return set()
        try:
            p = psutil.Process(int(rec["pid"]))
            return {p.pid, *(c.pid for c in p.children(recursive=True))}
        except psutil.Error:
            return set()

    # -- logs --------------------------------------------------------------------------------
    def follow_logs(self, ident: str, sink: LineSink, *, from_start: bool = True, tail: int = 300) -> _FileFollow:
        rec = self._find(ident)
        follow = _FileFollow()
        if rec is None:
            sink("stdout", None)
            sink("stderr", None)
            return follow
        for stream in ("stdout", "stderr"):
            t = threading.Thread(
                target=self._tail, args=(rec, stream, sink, follow, from_start, tail),
                name=f"engine-logs-{stream}-{ident}", daemon=True,
            )
            follow.threads.append(t)
            t.start()
        return follow

    def _tail(self, rec: Record, stream: Stream, sink: LineSink, follow: _FileFollow,
              from_start: bool, tail: int) -> None:
        splitter = LineSplitter()
        try:
            with open(str(rec[stream]), "rb") as fh:
                if not from_start:
                    existing = fh.read().splitlines()  # always consume: following starts at the end
                    lines = existing[-tail:] if tail > 0 else []
                    for raw in lines:
                        sink(stream, raw.decode("utf-8", "replace"))
                while not follow.stop.is_set():
                    chunk = fh.read(65536)
                    if chunk:
                        for text in splitter.feed(chunk):
                            sink(stream, text)
                        continue
                    if not self._instance(rec).running:
                        rest = fh.read()
                        for text in splitter.feed(rest) + splitter.flush():
                            sink(stream, text)
                        break
                    follow.stop.wait(0.05)
        except OSError:
            pass
        finally:
            sink(stream, None)

    def read_logs(self, ident: str, *, max_lines: int = 50000) -> builtins.list[tuple[Stream, str]]:
        rec = self._find(ident)
        out: list[tuple[Stream, str]] = []
        if rec is None:
            return out
        for stream in ("stdout", "stderr"):
            try:
                with open(str(rec[stream]), "rb") as fh:
                    for i, ln in enumerate(fh):
                        if i >= max_lines:
                            break
                        out.append((stream, ln.decode("utf-8", "replace").rstrip("\r\n")))
            except OSError:
                continue
        return out

    def tail_logs(self, ident: str, lines: int) -> builtins.list[tuple[Stream, str]]:
        rec = self._find(ident)
        out: list[tuple[Stream, str]] = []
        if rec is None or lines <= 0:
            return out
        for stream in ("stdout", "stderr"):
            try:
                with open(str(rec[stream]), "rb") as fh:
                    last = collections.deque(fh, maxlen=lines)
            except OSError:
                continue
            out += [(stream, ln.decode("utf-8", "replace").rstrip("\r\n")) for ln in last]
        return out
