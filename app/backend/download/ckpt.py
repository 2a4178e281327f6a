"""After planescache extraction: does its meta.json ckpt_id equal the recipe's pin
(`VLLM_MOE_W2_CKPT_ID`; docs/downloads.md, "After planescache")?"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.backend.config.settings import Settings


@dataclass(frozen=True)
class CkptCheck:
    status: Literal["match", "mismatch", "not_found"]
    expected: str
    found: tuple[str, ...] = ()
    meta_paths: tuple[str, ...] = ()
    message: str = ""


def _planescache_dir(settings: Settings, dest: Path | None) -> Path:
    root = dest or settings.data_dir
    for art in settings.recipe.artifacts:
        if art.id == "planescache":
            return root / art.yields
    return root / "planescache"


def check_ckpt_id(settings: Settings, dest: Path | None = None) -> CkptCheck:
    """Read every `<planescache>/v2/*/tp*-rank*/meta.json` and compare `ckpt_id` with the recipe pin."""
    expected = settings.recipe.model.ckpt_id
    base = _planescache_dir(settings, dest)
    metas = sorted(base.glob("v2/*/tp*-rank*/meta.json")) if base.is_dir() else []
    found, paths = [], []
    for meta in metas:
        try:
            found.append(str(json.loads(meta.read_text()).get("ckpt_id", "")))
            paths.append(str(meta))
        except (OSError, ValueError):
            continue
    if not found:
        return CkptCheck("not_found", expected, message=f"no planescache meta.json under {base}/v2/ yet "
                         "(download the planescache artifact first)")
    if expected in found:
        return CkptCheck("match", expected, tuple(found), tuple(paths),
                         f"planescache ckpt_id matches the recipe pin {settings.recipe.model.ckpt_id_env}={expected[:16]}…")
    return CkptCheck("mismatch", expected, tuple(found), tuple(paths),
                     f"planescache ckpt_id {found[0][:16]}… differs from the recipe pin {expected[:16]}…: the engine "
                     "would miss the cache and re-quantize (~51 GiB host RAM); re-download or fix the pin")
