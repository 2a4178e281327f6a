"""Self-test results on disk: one JSON file per run under <state>/selftest/, keyed by profile, engine
image id, recipe hash and date (the issue's key), so a changed image or recipe shows as stale."""

from __future__ import annotations

import json
import re
from pathlib import Path

from app.backend.web.exports import write_export
from app.backend.files.atomic import atomic_write
from app.backend.selftest.report import to_json_text, to_markdown
from app.backend.selftest.types import SelfTestResult

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


class ResultsStore:
    def __init__(self, state_dir: Path):
        self.root = Path(state_dir) / "selftest"

    def save(self, result: SelfTestResult) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        stamp = result.date.replace(":", "").replace("-", "")
        name = f"{_SAFE.sub('_', result.profile_id)}--{result.recipe_hash}--{stamp}.json"
        path = self.root / name
        atomic_write(path, json.dumps(result.to_json(), indent=1), mode=0o600)  # a crash never leaves half a result
        return path

    def all(self, profile_id: str | None = None) -> list[SelfTestResult]:
        """Newest first; unreadable files are skipped (a stored result never breaks the panel)."""
        out = []
        for p in self.root.glob("*.json") if self.root.is_dir() else []:
            try:
                r = SelfTestResult.from_json(json.loads(p.read_text(encoding="utf-8")))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if profile_id is None or r.profile_id == profile_id:
                out.append(r)
        return sorted(out, key=lambda r: r.date, reverse=True)

    def latest(self, profile_id: str) -> SelfTestResult | None:
        found = self.all(profile_id)
        return found[0] if found else None


def export_file(state_dir: Path, result: SelfTestResult, fmt: str) -> Path:
    """Write the result as Markdown ('md') or JSON ('json') under <state>/exports/ for download."""
    if fmt not in ("md", "json"):
        raise ValueError(f"export format must be md or json, got {fmt!r}")
    stamp = result.date[:19].replace(":", "").replace("-", "")
    return write_export(state_dir, f"selftest-{_SAFE.sub('_', result.profile_id)}-{stamp}.{fmt}",
                        to_markdown(result) if fmt == "md" else to_json_text(result))
