"""Private files: the panel's databases hold chats and engine history, readable by the owner only
(docs/ui-and-safety.md, file modes)."""

from __future__ import annotations

import os
from pathlib import Path


def create_private(path: Path) -> None:
    """Create `path` (if missing) with mode 0600 before SQLite opens it: SQLite gives its -wal/-shm
    files the database's own mode, and an older, looser file is tightened."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)
