"""Is a finished artifact still on disk? The journal says what a run did; the disk says what is there now
(issue 29: "all complete and verified" after the extracted folder was moved away). docs/downloads.md,
"The disk, not only the journal"."""

from __future__ import annotations

from pathlib import Path

PIN_GLOB = "v2/*/tp*-rank*/meta.json"  # the planescache's ckpt pin files (ckpt.py compares their ckpt_id)


def missing_on_disk(dest: Path, artifact_id: str, yields: str) -> str:
    """'' when the artifact's extracted output is there; else what is missing, in words (a few stat calls)."""
    root = dest / yields
    if not root.is_dir():
        return f"{root}/ is missing (moved or deleted?)"
    if next(root.iterdir(), None) is None:
        return f"{root}/ is empty"
    if artifact_id == "planescache" and next(root.glob(PIN_GLOB), None) is None:
        return f"no ckpt pin file ({PIN_GLOB}) under {root}/"
    return ""
