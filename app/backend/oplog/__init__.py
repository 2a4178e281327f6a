"""The operator's log: every decision and every caught error, once, in one key=value format.

One logger tree (`moet_panel.<component>`), two sinks set up by `configure()`: stderr (journald under
systemd) and a size-rotated file `panel.log` in the state dir (0600; `moet-panel logs --panel [-f]` shows it).
Two calls for the code that decides or catches:

- `decision(component, action, who=..., **fields)`: a start, stop, switch, restart and why, a give-up, an
  alert sent, a key created or revoked, a failed login, a setting changed; `who` says who asked
  (`user:NAME`, `cli`, `key:NAME`, `supervisor`, `panel`, `page`).
- `caught(component, exc, context, **fields)`: an exception handled instead of raised, logged once with its
  context and counted in `moet_panel_errors_total{component}` (`error_counts()`, read by the Prometheus
  export).

Secrets never reach a sink: every record passes `app.backend.oplog.redact` (HF tokens, API keys, notify URLs).
Why key=value and not JSON lines: journalctl and grep read it as it is, and `logfmt` parsers (Loki, vector)
read it too (docs/engine.md "The operator's log").
"""

from __future__ import annotations

import io
import logging
import logging.handlers
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, cast

ROOT = "moet_panel"
LOG_FILE = "panel.log"
MAX_BYTES = 5 * 1024 * 1024  # 5 MiB a file, 3 old files kept: weeks of decisions, bounded on disk
BACKUPS = 3

# who asked: one spelling for the fixed ones; `user:NAME` and `key:NAME` are built by `user()` / `key()`
CLI = "cli"
SUPERVISOR = "supervisor"
PANEL = "panel"
PAGE = "page"  # the web page without a login (loopback)
OUTSIDE = "outside"  # something outside the panel (docker, another program) changed the box


def user(name: str | None) -> str:
    return f"user:{name}" if name else PAGE


def key(name: str) -> str:
    return f"key:{name}"


def logger(component: str) -> logging.Logger:
    return logging.getLogger(f"{ROOT}.{component}")


def _quote(value: object) -> str:
    text = str(value)
    if text == "" or any(c in text for c in ' ="\\\n\t'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t") + '"'
    return text


def kv(fields: Mapping[str, object]) -> str:
    """`a=1 b="two words"`: logfmt, the values quoted only when they need it."""
    return " ".join(f"{k}={_quote(v)}" for k, v in fields.items() if v is not None)


def decision(component: str, action: str, *, who: str, level: int = logging.INFO, **fields: object) -> None:
    """One line for one decision: `component=engine action=restart who=supervisor reason=...`."""
    logger(component).log(level, kv({"component": component, "action": action, "who": who, **fields}))


def caught(component: str, exc: BaseException, context: str, *, level: int = logging.WARNING,
           traceback: bool = False, **fields: object) -> None:
    """An exception handled instead of raised: logged once with what was being done, and counted.
    `traceback=True` for the unexpected (a bug), off for the expected kinds (Docker away, a timeout)."""
    logger(component).log(level, kv({"component": component, "action": "error", "context": context,
                                     "error": f"{type(exc).__name__}: {exc}", **fields}),
                          exc_info=exc if traceback else None, extra={"moet_error": True})


class ErrorCounter(logging.Handler):
    """Counts the `caught()` records per component (the /metrics counter), whatever the sinks."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self._counts: dict[str, int] = {}
        self._mu = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, "moet_error", False):
            return
        component = record.name[len(ROOT) + 1:].split(".")[0] if record.name.startswith(ROOT + ".") else "other"
        with self._mu:
            self._counts[component] = self._counts.get(component, 0) + 1

    def counts(self) -> dict[str, int]:
        with self._mu:
            return dict(self._counts)


def _counter() -> ErrorCounter:
    root = logging.getLogger(ROOT)
    for h in root.handlers:
        if isinstance(h, ErrorCounter):
            return h
    h = ErrorCounter()
    root.addHandler(h)
    return h


def error_counts() -> dict[str, int]:
    """`{component: errors caught}` since the process started (`moet_panel_errors_total`)."""
    return _counter().counts()


class _Format(logging.Formatter):
    """`ts=... level=INFO logger=moet_panel.engine <the record's key=value message>`; a record from a library
    (uvicorn, httpx) keeps its text as `msg="..."`."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if not record.name.startswith(ROOT + ".") or "=" not in message.split(" ", 1)[0]:
            message = kv({"msg": message})
        head = kv({"ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}",
                   "level": record.levelname, "logger": record.name})
        line = f"{head} {message}"
        if record.exc_info or record.exc_text:  # exc_text: already redacted by the handler's filter
            line += " traceback=" + _quote(record.exc_text or self.formatException(record.exc_info))  # type: ignore[arg-type]
        return line


class _PrivateRotatingFile(logging.handlers.RotatingFileHandler):
    """The rotated file is created 0600: a log line may name a user or a key (never its secret)."""

    def _open(self) -> io.TextIOWrapper:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fdopen(fd, "a", encoding=self.encoding)


def log_path(state_dir: Path) -> Path:
    return state_dir / LOG_FILE


_CONFIGURED = "_moet_panel_oplog"


class _CurrentStderr(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr as it is at each record, not as it was at configure time: a process that swaps it (pytest's capture,
    a daemon's redirection) would otherwise leave a handler writing to a closed file ("I/O operation on closed
    file", seen in the suite's workers), as logging's own last-resort handler does."""

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:
        pass


def configure(state_dir: Path | None, *, stream: IO[str] | None = None, level: int = logging.INFO,
              console: bool = True) -> None:
    """Idempotent: the stderr sink and (with a state dir) the rotated file, redaction on every record.
    `console=False`: the file only — a CLI command whose stderr is its user's (`engine start|stop|switch`), whose
    decisions still reach the operator's log (`moet-panel logs --panel`)."""
    from app.backend.oplog.redact import install_log_redaction

    root = logging.getLogger()
    fmt = _Format()
    if not getattr(root, _CONFIGURED, False):
        if console:
            handler = logging.StreamHandler(stream) if stream is not None else _CurrentStderr()
            handler.setFormatter(fmt)
            root.addHandler(handler)
        if root.level == logging.NOTSET or root.level > level:
            root.setLevel(level)
        setattr(root, _CONFIGURED, True)
        # one INFO line per internal request is noise (issue 49: half the log); httpx2: the openai SDK's client
        for noisy in ("httpx", "httpx2"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    if state_dir is not None:
        path = str(log_path(state_dir))
        if not any(isinstance(h, logging.handlers.RotatingFileHandler) and h.baseFilename == path for h in root.handlers):
            state_dir.mkdir(parents=True, exist_ok=True)
            fh = _PrivateRotatingFile(path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
            fh.setFormatter(fmt)
            root.addHandler(fh)
    _counter()
    install_log_redaction()


def read_lines(state_dir: Path, n: int = 200) -> list[str]:
    """The last `n` lines of the operator's log (older rotated files first when the current one is short)."""
    path = log_path(state_dir)
    files = [Path(f"{path}.{i}") for i in range(BACKUPS, 0, -1)] + [path]
    lines: list[str] = []
    for f in files:
        try:
            lines.extend(f.read_text(encoding="utf-8", errors="replace").splitlines())
        except FileNotFoundError:
            continue
    return lines[-n:] if n > 0 else lines


def follow(state_dir: Path, poll_s: float = 0.5) -> Iterator[str]:
    """New lines as they are written (`logs --panel -f`), across a rotation."""
    import time

    path = log_path(state_dir)
    pos = path.stat().st_size if path.exists() else 0
    ino = path.stat().st_ino if path.exists() else None
    buf = ""
    while True:
        try:
            st = path.stat()
        except FileNotFoundError:
            time.sleep(poll_s)
            continue
        if st.st_ino != ino or st.st_size < pos:  # rotated: read the new file from its start
            ino, pos = st.st_ino, 0
        if st.st_size > pos:
            with path.open("r", encoding="utf-8", errors="replace") as f:
                f.seek(pos)
                buf += f.read()
                pos = f.tell()
            *done, buf = buf.split("\n")
            yield from done
        else:
            time.sleep(poll_s)


class Once:
    """`caught()` for a loop: a repeating error is logged (and counted) once, not once per turn. The same
    error in the same context is logged again only when it changed, after `ok(context)` (it healed), or every
    `every_s` with how many times it repeated meanwhile (so a lasting fault still shows in a tailing log)."""

    def __init__(self, component: str, *, every_s: float = 600.0, clock: Callable[[], float] | None = None) -> None:
        import time

        self.component = component
        self.every_s = every_s
        self._clock = clock or time.monotonic
        self._last: dict[str, tuple[str, float, int]] = {}  # context -> (error text, logged at, repeats since)
        self._mu = threading.Lock()

    def caught(self, exc: BaseException, context: str, *, traceback: bool = False, **fields: object) -> bool:
        """Log `exc` unless it repeats the last one of `context`; True when it was logged."""
        text = f"{type(exc).__name__}: {exc}"
        now = self._clock()
        with self._mu:
            last = self._last.get(context)
            if last is not None and last[0] == text and now - last[1] < self.every_s:
                self._last[context] = (last[0], last[1], last[2] + 1)
                return False
            repeats = last[2] if last is not None and last[0] == text else 0
            self._last[context] = (text, now, 0)
        fields["repeated"] = repeats or None
        caught(self.component, exc, context, traceback=traceback, **cast(dict[str, Any], fields))
        return True

    def ok(self, context: str) -> None:
        """The context worked again: its next error is news."""
        with self._mu:
            self._last.pop(context, None)
