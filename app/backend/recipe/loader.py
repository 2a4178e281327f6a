"""Load and validate recipe files; errors name the file, the field path and what is expected."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from app.backend.recipe.schema import Recipe
from app.backend.recipe.toml_bounded import MAX_TOML_BYTES, TomlLimitError, loads_bounded

ASSETS_DIR = Path(__file__).resolve().parents[3] / "assets"
RECIPES_DIR = ASSETS_DIR / "recipes"
DEFAULT_RECIPE = RECIPES_DIR / "ds4-flash-0731-sm120.toml"
SIMULATED_RECIPE = RECIPES_DIR / "simulated.toml"


@dataclass(frozen=True)
class RecipeIssue:
    path: str  # dotted field path, e.g. "profiles[1].env_add.BAD NAME"
    message: str


class RecipeError(ValueError):
    """A recipe could not be loaded. `issues` lists every problem found."""

    def __init__(self, file: Path, issues: list[RecipeIssue]) -> None:
        self.file = file
        self.issues = issues
        lines = [f"{file}: {i.path}: {i.message}" for i in issues]
        super().__init__("invalid recipe\n  " + "\n  ".join(lines))


def _field_path(loc: tuple[object, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _expected(err: dict[str, object]) -> str:
    kind = str(err.get("type", ""))
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return "unknown key (not part of the recipe schema; check the spelling)"
    if kind == "missing":
        return "required key is missing"
    return msg


_PATH_PREFIX_RE = re.compile(r"^([A-Za-z_][\w.\[\]-]*): (.+)$", re.S)


def _issue(err: ErrorDetails) -> RecipeIssue:
    """One pydantic error as a RecipeIssue; cross-field checks put their path in front of the message."""
    path, message = _field_path(tuple(err["loc"])), _expected(err)  # type: ignore[arg-type]
    if path == "(top level)":
        m = _PATH_PREFIX_RE.match(message)
        if m:
            path, message = m.group(1), m.group(2)
    return RecipeIssue(path, message)


def parse_recipe(data: dict[str, object], file: Path) -> Recipe:
    try:
        return Recipe.model_validate(data)
    except ValidationError as exc:
        issues = [_issue(e) for e in exc.errors()]
        raise RecipeError(file, issues) from None


def load_recipe(file: Path | str) -> Recipe:
    """Read a recipe TOML file and validate it.

    Raises:
        RecipeError: unreadable file, TOML syntax error, or any schema violation.
    """
    path = Path(file)
    try:
        if path.stat().st_size > MAX_TOML_BYTES:
            raise RecipeError(path, [RecipeIssue("(size)", f"refused: file is over {MAX_TOML_BYTES:,} bytes")])
        raw = path.read_bytes()
    except OSError as exc:
        raise RecipeError(path, [RecipeIssue("(file)", f"cannot read: {exc.strerror or exc}")]) from None
    try:
        data = loads_bounded(raw.decode("utf-8"))
    except TomlLimitError as exc:
        raise RecipeError(path, [RecipeIssue("(size)", f"refused: {exc}")]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RecipeError(path, [RecipeIssue("(syntax)", f"not valid TOML: {exc}")]) from None
    return parse_recipe(data, path)
