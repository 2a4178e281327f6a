"""Paths where users live: a data dir under a $HOME-like folder that is neither the system temp dir nor
the working dir (Gradio serves those two by default, so a test under /tmp hides path defects: issue 29),
and the panel's log checked for tracebacks."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

USER_SHARE = Path.home() / ".local" / "share"


@contextmanager
def user_data_dir() -> Iterator[Path]:
    """A fresh data dir `~/.local/share/moet-panel-test-XXXX/data` (the shape of the demo default
    `~/.local/share/moet-panel/demo`), removed afterwards, failing or not."""
    made_share = not USER_SHARE.exists()
    USER_SHARE.mkdir(parents=True, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="moet-panel-test-", dir=USER_SHARE))
    try:
        data = home / "data"
        for other in (Path(tempfile.gettempdir()), Path.cwd()):
            assert other.resolve() not in data.resolve().parents, f"{data} is under {other}: not a user's path"
        yield data
    finally:
        shutil.rmtree(home, ignore_errors=True)
        if made_share:
            for d in (USER_SHARE, USER_SHARE.parent):
                try:
                    d.rmdir()  # only if empty: never remove anything of the user's
                except OSError:
                    break


def tracebacks(log: str) -> list[str]:
    """The tracebacks (and Gradio path errors) in a panel's log text, each with a few lines after it."""
    lines = log.splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)") or "InvalidPathError" in line:
            found.append("\n".join(lines[i:i + 25]))
    return found


def own_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o777


def open_panel(page: object, url: str | None = None) -> None:
    """Open (or, without `url`, reload) the panel and wait for its load event: the page then shows the
    backend's state (lists, choices), not the state of when the panel built it."""
    if url is None:
        page.reload()  # type: ignore[attr-defined]
    else:
        page.goto(url)  # type: ignore[attr-defined]
    page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached")  # type: ignore[attr-defined]
