"""One small typed JSON state file, read and written whole: the engine's wish, the gateway's switch, the
Service tab's settings. Written once here (issue 41): atomic and durable (`fileio.atomic_write`), private by
default (0600: a notify URL may carry a password), validated on read by pydantic's TypeAdapter for the
dataclass it holds (the recipe's models use pydantic already), and never trusted further than that: a file
that is missing, unreadable or of another shape reads as `None`, and the caller's default is the safe side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from app.backend import oplog
from app.backend.files.atomic import atomic_write

T = TypeVar("T")


class JsonStore(Generic[T]):
    def __init__(self, path: Path, kind: type[T], mode: int = 0o600) -> None:
        self.path = Path(path)
        self._adapter: TypeAdapter[T] = TypeAdapter(kind)
        self._mode = mode
        self._said: tuple[int, int] | None = None  # the broken file (mtime, size) already in the operator's log

    def read(self) -> T | None:
        """The value, or None when the file is missing, unreadable or not of this shape (the last two said once
        in the operator's log: a hand edit that the panel ignores must not go unnoticed)."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._say(exc)
            return None
        try:
            # strict: "true" is not True (the gateway's switch is never turned on by a guess)
            return self._adapter.validate_json(data, strict=True)
        except (ValueError, ValidationError) as exc:
            self._say(exc)
            return None

    def _say(self, exc: Exception) -> None:
        try:
            st = self.path.stat()
            mark = (st.st_mtime_ns, st.st_size)
        except OSError:
            mark = (0, 0)
        if mark != self._said:
            self._said = mark
            oplog.caught("files", exc, f"reading {self.path.name}: ignored, the defaults apply", path=str(self.path))

    def write(self, value: T) -> None:
        """Raises OSError (a full disk, a read-only dir); the old file is then intact."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = self._adapter.dump_python(value, mode="json")
        atomic_write(self.path, json.dumps(data, indent=1) + "\n", mode=self._mode)
