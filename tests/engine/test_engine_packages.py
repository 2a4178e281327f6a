"""engine/ is split by concern (issue 50 item 4; docs/engine.md "Module map"): every sub-package says its job
in one paragraph, no module is over 400 lines, and the sub-packages import one another one way only (no
cycle, counting imports inside functions too). Parsed with `ast`; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import_boundaries import _all_imports

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "app" / "backend" / "engine"
MAX_LINES = 400


def _part(module: str) -> str | None:
    """`app.backend.engine.control.boot` -> `control`; a top-level module is its own part (`controller`)."""
    parts = module.split(".")
    return parts[3] if len(parts) > 3 and parts[:3] == ["app", "backend", "engine"] else None


def _graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {}
    for mod, names in _all_imports().items():
        a = _part(mod)
        if a is None:
            continue
        g.setdefault(a, set()).update(b for n in names if (b := _part(n)) is not None and b != a)
    return g


def _cycle(g: dict[str, set[str]]) -> list[str]:
    """One cycle of `g` as [a, b, ..., a], or []."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> list[str]:
        state[n] = 1
        path.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        state[n] = 2
        path.pop()
        return []

    for n in sorted(g):
        if n not in state and (found := visit(n)):
            return found
    return []


def test_no_module_of_the_engine_is_over_400_lines() -> None:
    long = {str(f.relative_to(ENGINE)): n for f in ENGINE.rglob("*.py") if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_sub_package_says_its_job_in_one_paragraph() -> None:
    subs = sorted(p for p in ENGINE.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert len(subs) >= 5
    for p in subs:
        doc = ast.get_docstring(ast.parse((p / "__init__.py").read_text()))
        assert doc and "\n\n" not in doc.strip() and len(doc) > 120, p.name


def test_the_engine_top_holds_only_its_facades() -> None:
    top = sorted(p.stem for p in ENGINE.glob("*.py") if p.name != "__init__.py")
    assert top == ["controller", "errlog", "gpus", "upgrade"]


def test_the_sub_packages_import_one_another_one_way_only() -> None:
    g = _graph()
    assert {"control", "decider", "runtime", "lifecycle", "supervision", "builds", "logs"} <= set(g)
    assert _cycle(g) == []
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check sees one
