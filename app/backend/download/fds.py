"""The downloader's file descriptors: each one opened, used and closed by one call of one thread.

No fd is shared between threads or kept in an object another thread can reach, so none needs a lock,
none can be closed under a thread still using it, and none is closed twice: a close and a `pwrite`
through a stale fd number could land in another part or in a file being extracted (issue 49;
docs/downloads.md, "File descriptors"). A mapping made from one (`mmap`) keeps its own reference and
outlives the close.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def owned_fd(path: Path | str, flags: int, mode: int = 0o644) -> Iterator[int]:
    """An fd on `path` for this block of this thread: opened here, closed here, once."""
    fd = os.open(path, flags, mode)
    try:
        yield fd
    finally:
        os.close(fd)
