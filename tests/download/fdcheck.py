"""A test mode that watches every file descriptor the downloader and extractor open (docs/downloads.md,
"File descriptors").

`fd_ownership()` wraps `os.open`, `os.dup`, `os.fdopen`, `os.close` and the calls that use an fd
(`os.pwrite`, `os.write`, `os.read`, `os.pread`, `os.fstat`, `os.fsync`, `os.lseek`, `os.ftruncate`,
`os.fchmod`, `mmap.mmap`) for the length of a block. An fd's owner is the thread that opened it: the
downloader's rule is that every fd lives inside one call of one thread, which opens, uses and closes it.
At the end of the block it fails on:

- a foreign close: a close by a thread other than the fd's owner (the structural fault behind issue 49's
  EBADF, seen on every run, not only when the race happens to bite), or a close by the download code of
  an fd it did not open;
- a foreign use: another thread writing, reading, mapping or stat-ing an fd it does not own;
- EBADF from any of the wrapped calls, on the download code's behalf;
- a close that hits another file than the one opened (the number was closed and reused meanwhile);
- an fd the download code opened and never closed.

Only fds opened from the download package (app/backend/download/) are watched; the test's own servers,
pytest and the libraries keep theirs unseen, except that a close of one of them by the download code
is foreign.
"""

from __future__ import annotations

import errno
import mmap
import os
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SUBJECT = str(Path(__file__).resolve().parents[2] / "app" / "backend" / "download") + os.sep
_HERE = os.path.abspath(__file__)
USES = ("pwrite", "write", "read", "pread", "fstat", "fsync", "lseek", "ftruncate", "fchmod", "fdatasync")


@dataclass
class Opened:
    fd: int
    owner: int  # thread ident
    owner_name: str
    ident: tuple[int, int]  # (st_dev, st_ino) when opened
    where: str


@dataclass
class FdReport:
    opens: int = 0
    closes: int = 0
    foreign_closes: list[str] = field(default_factory=list)
    foreign_uses: list[str] = field(default_factory=list)
    ebadf: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    leaked: list[str] = field(default_factory=list)

    @property
    def faults(self) -> list[str]:
        return self.foreign_closes + self.foreign_uses + self.ebadf + self.reused + self.leaked

    def summary(self) -> str:
        return (f"{self.opens} opens, {self.closes} closes, {len(self.foreign_closes)} foreign closes, "
                f"{len(self.foreign_uses)} foreign uses, {len(self.ebadf)} EBADF, {len(self.reused)} reused, "
                f"{len(self.leaked)} leaked")


def _caller(subject: str) -> tuple[bool, str]:
    """(whether the nearest caller outside this module is under `subject`, where it is)."""
    f = sys._getframe(1)
    while f is not None and os.path.abspath(f.f_code.co_filename) == _HERE:
        f = f.f_back  # type: ignore[assignment]
    if f is None:
        return False, "?"
    name = os.path.abspath(f.f_code.co_filename)
    return name.startswith(subject), f"{os.path.relpath(name)}:{f.f_lineno} {f.f_code.co_name}"


def _stack() -> str:
    return "".join(e for e in traceback.format_stack(limit=12) if not e.startswith(f'  File "{_HERE}"'))


class _Tracker:
    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.lock = threading.RLock()  # a finalizer may run inside a wrapped call and call one
        self.open: dict[int, Opened] = {}
        self.report = FdReport()
        self.real: dict[str, Any] = {}

    def _fault(self, kind: list[str], text: str) -> None:
        entry = f"{text} [thread {threading.current_thread().name}]\n{_stack()}"  # outside the lock: a GC
        with self.lock:  # finalizer run meanwhile may call a wrapped os function
            kind.append(entry)

    def opened(self, fd: int, where: str) -> None:
        st = self.real["fstat"](fd)
        me = threading.current_thread()
        with self.lock:
            self.open[fd] = Opened(fd, me.ident or 0, me.name, (st.st_dev, st.st_ino), where)
            self.report.opens += 1

    def check_use(self, name: str, fd: int) -> None:
        with self.lock:
            o = self.open.get(fd)
        if o is not None and o.owner != threading.get_ident():
            self._fault(self.report.foreign_uses,
                        f"os.{name}({fd}) by a thread that does not own it (opened by {o.owner_name} at {o.where})")

    def check_close(self, fd: int) -> None:
        subject, where = _caller(self.subject)
        with self.lock:
            o = self.open.pop(fd, None)
            if o is not None:
                self.report.closes += 1
        if o is None:
            if subject:
                self._fault(self.report.foreign_closes, f"os.close({fd}) at {where}: an fd this code did not open")
            return
        if o.owner != threading.get_ident():
            self._fault(self.report.foreign_closes, f"os.close({fd}) at {where}: opened by thread {o.owner_name} at "
                                                    f"{o.where}, closed by another thread")
        try:
            st = self.real["fstat"](fd)
        except OSError:
            return  # EBADF: reported by the close itself
        if (st.st_dev, st.st_ino) != o.ident:
            self._fault(self.report.reused, f"os.close({fd}) at {where}: the number now names another file "
                                            f"(closed and reused since {o.where} opened it)")

    def ebadf(self, name: str, fd: int, exc: OSError) -> None:
        subject, where = _caller(self.subject)
        with self.lock:
            watched = fd in self.open
        if subject or watched:
            self._fault(self.report.ebadf, f"os.{name}({fd}) at {where}: {exc}")


def _wrap_use(t: _Tracker, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(fd: Any, *args: Any, **kw: Any) -> Any:
        if isinstance(fd, int):
            t.check_use(name, fd)
        try:
            return real(fd, *args, **kw)
        except OSError as exc:
            if exc.errno == errno.EBADF and isinstance(fd, int):
                t.ebadf(name, fd, exc)
            raise
    return wrapper


@contextmanager
def fd_ownership(fail: bool = True, subject: str = SUBJECT) -> Iterator[FdReport]:
    """Watch the fds the code under `subject` (a directory) opens, for the block (module docstring); at its
    end, fail (AssertionError) on any fault when `fail`, else leave them in the report it yields."""
    t = _Tracker(subject)
    real = t.real
    for name in ("open", "close", "dup", "fdopen", *USES):
        real[name] = getattr(os, name)
    real["mmap"] = mmap.mmap

    def w_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        fd = real["open"](path, flags, mode, dir_fd=dir_fd)
        subject, where = _caller(t.subject)
        if subject:
            t.opened(fd, f"{where} ({os.fspath(path)})")
        return int(fd)

    def w_close(fd: int) -> None:
        t.check_close(fd)
        try:
            real["close"](fd)
        except OSError as exc:
            if exc.errno == errno.EBADF:
                t.ebadf("close", fd, exc)
            raise

    def w_dup(fd: int) -> int:
        t.check_use("dup", fd)
        new = real["dup"](fd)
        subject, where = _caller(t.subject)
        if subject:
            t.opened(new, f"{where} (dup of {fd})")
        return int(new)

    def w_fdopen(fd: int, *args: Any, **kw: Any) -> Any:
        t.check_use("fdopen", fd)
        with t.lock:
            t.open.pop(fd, None)  # the file object closes it now (its close is not os.close)
        return real["fdopen"](fd, *args, **kw)

    def w_mmap(fd: int, *args: Any, **kw: Any) -> mmap.mmap:
        t.check_use("mmap", fd)
        try:
            return real["mmap"](fd, *args, **kw)
        except OSError as exc:
            if exc.errno == errno.EBADF:
                t.ebadf("mmap", fd, exc)
            raise

    fakes: dict[str, Any] = {"open": w_open, "close": w_close, "dup": w_dup, "fdopen": w_fdopen,
                             **{n: _wrap_use(t, n, real[n]) for n in USES}}
    for name, fake in fakes.items():
        setattr(os, name, fake)
    mmap.mmap = w_mmap  # type: ignore[misc]
    try:
        yield t.report
    finally:
        for name in fakes:
            setattr(os, name, real[name])
        mmap.mmap = real["mmap"]  # type: ignore[misc]
        with t.lock:
            for o in t.open.values():
                t.report.leaked.append(f"fd {o.fd} opened by thread {o.owner_name} at {o.where} never closed")
                try:
                    os.close(o.fd)  # the test's process stays clean for the tests after it
                except OSError:
                    pass
            t.open.clear()
    if fail and t.report.faults:
        raise AssertionError(f"fd ownership: {t.report.summary()}\n\n" + "\n".join(t.report.faults[:10]))
