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

from app.backend.fileio import atomic_write

T = TypeVar("T")


class JsonStore(Generic[T]):
    def __init__(self, path: Path, kind: type[T], mode: int = 0o600) -> None:
        self.path = Path(path)
        self._adapter: TypeAdapter[T] = TypeAdapter(kind)
        self._mode = mode

    def read(self) -> T | None:
        """The value, or None when the file is missing, unreadable or not of this shape."""
        try:
            # strict: "true" is not True (the gateway's switch is never turned on by a guess)
            return self._adapter.validate_json(self.path.read_bytes(), strict=True)
        except (OSError, ValueError, ValidationError):
            return None

    def write(self, value: T) -> None:
        """Raises OSError (a full disk, a read-only dir); the old file is then intact."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = self._adapter.dump_python(value, mode="json")
        atomic_write(self.path, json.dumps(data, indent=1) + "\n", mode=self._mode)
