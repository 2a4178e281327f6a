"""Containment check for tar members, complete on its own.

PEP 706's `data` filter is applied too where the interpreter has it, but 3.11 releases before 3.11.4
lack it and those before 3.11.13 have known bypasses (docs/downloads.md, "Safe extraction"), so this check alone must refuse:
absolute names, `..` components, names whose parent resolves outside the destination (writes through
an earlier symlink), symlinks/hardlinks pointing outside, device nodes/FIFOs/other special types,
and setuid/setgid bits.
"""

from __future__ import annotations

import os
import stat
import tarfile
from pathlib import PurePosixPath

from app.backend.download.types import UnsafeArchiveError


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _refuse(m: tarfile.TarInfo, why: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(f"refused archive member {m.name!r}: {why}; the archive is not safe to extract "
                              "(nothing outside the destination was written)")


def check_member(m: tarfile.TarInfo, dest_real: str) -> str:
    """Raise UnsafeArchiveError for a hostile member; return the absolute target path otherwise."""
    name = m.name
    if not name or "\x00" in name or "\x00" in (m.linkname or ""):
        raise _refuse(m, "empty name or NUL byte")
    if name.startswith("/") or PurePosixPath(name).is_absolute():
        raise _refuse(m, "absolute path")
    if ".." in PurePosixPath(name).parts:
        raise _refuse(m, "'..' in path")
    if m.ischr() or m.isblk() or m.isfifo():
        raise _refuse(m, "device node or FIFO")
    if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
        raise _refuse(m, f"unsupported member type {m.type!r}")
    if m.mode & (stat.S_ISUID | stat.S_ISGID):
        raise _refuse(m, "setuid/setgid bit")
    target = os.path.join(dest_real, os.path.normpath(name))
    parent_real = os.path.realpath(os.path.dirname(target))
    if not _within(parent_real, dest_real):
        raise _refuse(m, "its directory resolves outside the destination (through a link)")
    if m.issym():
        link = m.linkname
        if not link or link.startswith("/"):
            raise _refuse(m, f"symlink to absolute path {link!r}")
        resolved = os.path.realpath(os.path.join(parent_real, link))
        if not _within(resolved, dest_real):
            raise _refuse(m, f"symlink {link!r} points outside the destination")
    if m.islnk():
        link = m.linkname
        if not link or link.startswith("/") or ".." in PurePosixPath(link).parts:
            raise _refuse(m, f"hard link to {link!r} outside the archive")
        if not _within(os.path.realpath(os.path.join(dest_real, link)), dest_real):
            raise _refuse(m, f"hard link {link!r} points outside the destination")
    return target


def apply_data_filter(m: tarfile.TarInfo, dest_real: str) -> tarfile.TarInfo:
    """PEP 706 `data` filter when available (it also normalises modes); our check already ran."""
    data_filter = getattr(tarfile, "data_filter", None)
    if data_filter is None:  # e.g. Debian's 3.11.2: our own check is the whole defence
        m = m.replace(deep=False) if hasattr(m, "replace") else m
        if m.isreg():
            m.mode = (m.mode & 0o755) | 0o600
        return m
    try:
        filtered = data_filter(m, dest_real)
    except tarfile.FilterError as exc:
        raise _refuse(m, f"PEP 706 data filter: {exc}") from None
    return filtered if filtered is not None else m
