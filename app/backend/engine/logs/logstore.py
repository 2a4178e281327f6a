"""Engine log lines: in-memory tail, listeners, and per-run files on disk (bounded).

Files: `<state_dir>/engine-logs/<container>-<start>.{stdout,stderr}.log`; each file stops growing at
`max_bytes` (a final marker line says so), and only the newest `keep_runs` runs are kept.
"""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Callable, IO

from app.backend.engine.errlog import ENGINE_ERRORS
from app.backend.contracts import LogLine

Listener = Callable[[LogLine], None]
DEFAULT_TAIL = 2000  # ≥ 250 required: the root cause sits above the API server's long traceback


class RunLogFiles:
    """The two files of one engine run; size-capped."""

    def __init__(self, directory: Path, container: str, started: float, max_bytes: int) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started))
        self.paths = {s: directory / f"{container}-{stamp}.{s}.log" for s in ("stdout", "stderr")}
        self._max = max_bytes
        self._sizes = {s: 0 for s in self.paths}
        self._files: dict[str, IO[bytes]] = {}
        directory.mkdir(parents=True, exist_ok=True)
        for s, p in self.paths.items():
            self._files[s] = open(p, "ab")
            self._sizes[s] = p.stat().st_size

    def write(self, line: LogLine) -> None:
        fh = self._files.get(line.stream)
        if fh is None or self._sizes[line.stream] >= self._max:
            return
        data = (line.text + "\n").encode("utf-8", "replace")
        if self._sizes[line.stream] + len(data) >= self._max:
            data = b"[moet-panel] log file size limit reached; later lines are only in memory / docker logs\n"
        fh.write(data)
        fh.flush()
        self._sizes[line.stream] += len(data)

    def close(self) -> None:
        for fh in self._files.values():
            try:
                fh.close()
            except OSError:
                pass
        self._files.clear()


class LogStore:
    """Thread-safe tail of the current engine's lines + listener fan-out + file persistence."""

    def __init__(self, log_dir: Path, *, tail: int = DEFAULT_TAIL, max_bytes: int = 20 << 20, keep_runs: int = 10):
        self._dir = Path(log_dir)
        self._tail: collections.deque[LogLine] = collections.deque(maxlen=tail)
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._files: RunLogFiles | None = None
        self._max_bytes = max_bytes
        self._keep = keep_runs
        self._version = 0  # bumps with every line and every new run: a view that kept it knows the tail is the same

    @property
    def version(self) -> int:
        return self._version

    @property
    def directory(self) -> Path:
        return self._dir

    def begin_run(self, container: str, started: float, *, persist: bool = True) -> None:
        """A new engine run: clear the tail, open its files, prune old runs."""
        with self._lock:
            if self._files is not None:
                self._files.close()
            self._tail.clear()
            self._version += 1
            self._files = None
            if persist:
                try:
                    self._files = RunLogFiles(self._dir, container, started, self._max_bytes)
                except OSError:
                    self._files = None  # unwritable data dir: keep serving from memory
        self._prune()

    def end_run(self) -> None:
        with self._lock:
            if self._files is not None:
                self._files.close()
                self._files = None

    def append(self, line: LogLine, *, persist: bool = True) -> None:
        with self._lock:
            self._tail.append(line)
            self._version += 1
            files = self._files if persist else None
            listeners = list(self._listeners)
            if files is not None:
                try:
                    files.write(line)
                except OSError:
                    pass
        for cb in listeners:
            try:
                cb(line)
            except Exception as exc:  # a broken listener must not stop log following
                ENGINE_ERRORS.caught("a log listener", exc, traceback=True)

    def add_listener(self, cb: Listener) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(cb)

        def unsubscribe() -> None:
            with self._lock:
                if cb in self._listeners:
                    self._listeners.remove(cb)

        return unsubscribe

    def recent(self, n: int) -> list[LogLine]:
        with self._lock:
            items = list(self._tail)
        return items[-n:] if n > 0 else []

    def current_files(self) -> dict[str, Path]:
        with self._lock:
            return dict(self._files.paths) if self._files else {}

    def runs(self) -> list[str]:
        """Saved runs (`<container>-<start>`), newest first."""
        stamps: dict[str, float] = {}
        try:
            for p in self._dir.glob("*.log"):
                run = p.name.rsplit(".", 2)[0]
                stamps[run] = max(stamps.get(run, 0.0), p.stat().st_mtime)
        except OSError:
            return []
        return sorted(stamps, key=stamps.__getitem__, reverse=True)

    def read_run(self, run: str, streams: tuple[str, ...] = ("stdout", "stderr"), max_lines: int = 5000) -> list[LogLine]:
        """The last lines of a saved run (stdout lines first, then stderr: the files keep them apart)."""
        if run not in self.runs():  # only names we listed: never a path from the user
            return []
        out: list[LogLine] = []
        for stream in streams:
            path = self._dir / f"{run}.{stream}.log"
            try:
                text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-max_lines:]
            except OSError:
                continue
            out += [LogLine(t, "stderr" if stream == "stderr" else "stdout", 0.0) for t in text]
        return out

    def run_path(self, run: str, stream: str) -> Path | None:
        if run not in self.runs() or stream not in ("stdout", "stderr"):
            return None
        p = self._dir / f"{run}.{stream}.log"
        return p if p.exists() else None

    def _prune(self) -> None:
        try:
            runs: dict[str, float] = {}
            for p in self._dir.glob("*.log"):
                run = p.name.rsplit(".", 2)[0]
                runs[run] = max(runs.get(run, 0.0), p.stat().st_mtime)
            for run in sorted(runs, key=runs.__getitem__)[: max(0, len(runs) - self._keep)]:
                for p in self._dir.glob(f"{run}.*.log"):
                    p.unlink(missing_ok=True)
        except OSError:
            pass
