"""Where the files the panel hands to the browser live: all under the panel's own 0700 state dir
(docs/ui-and-safety.md#file-modes), never in a shared, world-readable /tmp/gradio.

- `exports_dir`: the one folder export buttons write to (self-test and A/B reports, engine-log downloads,
  chat exports). The web server may serve from it (its only `allowed_paths` entry).
- `web_temp_dir`: the web server's own upload/cache folder, one per process (`gradio-<pid>`), so a second
  panel (another data dir or process) never serves this one's files; removed when the panel closes, and a
  dead process's folder is swept at the next start.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from app.backend.files.atomic import atomic_write, pid_alive

EXPORTS_SUBDIR = "exports"
WEB_TEMP_PREFIX = "gradio-"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.stat().st_mode & 0o077:  # an older, looser folder is tightened
        path.chmod(0o700)
    return path


def exports_dir(state_dir: Path) -> Path:
    """`<state_dir>/exports`, created 0700 (the state dir too). The one place export files go."""
    _private_dir(Path(state_dir))
    return _private_dir(Path(state_dir) / EXPORTS_SUBDIR)


def safe_name(name: str, limit: int = 160) -> str:
    """A file name made of [A-Za-z0-9._-] only (no path separators, no leading dot), at most `limit` chars."""
    cleaned = _UNSAFE.sub("_", name).lstrip(".") or "export"
    if len(cleaned) <= limit:
        return cleaned
    stem, dot, ext = cleaned.rpartition(".")
    if dot and 0 < len(ext) <= 8:
        return stem[: limit - len(ext) - 1] + "." + ext
    return cleaned[:limit]


def write_export(state_dir: Path, name: str, text: str) -> Path:
    """Write `text` to `<state_dir>/exports/<safe name>` (mode 0600) and return the path: the one call
    every export button uses (chat exports included: `write_export(settings.state_dir, name, text)`)."""
    path = exports_dir(state_dir) / safe_name(name)
    atomic_write(path, text, mode=0o600)  # a browser fetching it mid-write never gets half a report
    return path


def copy_export(state_dir: Path, src: Path, name: str) -> Path:
    """A copy of a file the panel keeps elsewhere in its state dir (a saved engine-log run), under the
    exports folder, mode 0600: what a download button hands to the browser."""
    path = exports_dir(state_dir) / safe_name(name)
    # created 0600 (never a moment at the umask's 0644) and tightened if an older copy was looser
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
        shutil.copyfileobj(inp, out)
    return path


def sweep_web_temp_dirs(state_dir: Path) -> list[Path]:
    """Remove `gradio-<pid>` folders left by panels that died without closing; returns what was removed."""
    removed = []
    for d in Path(state_dir).glob(WEB_TEMP_PREFIX + "*"):
        pid = d.name[len(WEB_TEMP_PREFIX):]
        if d.is_dir() and pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def web_temp_dir(state_dir: Path) -> Path:
    """This process's web upload/cache folder `<state_dir>/gradio-<pid>`, created 0700."""
    _private_dir(Path(state_dir))
    return _private_dir(Path(state_dir) / f"{WEB_TEMP_PREFIX}{os.getpid()}")


def remove_web_temp_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
