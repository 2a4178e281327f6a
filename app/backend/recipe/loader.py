"""Load and validate recipe files; errors name the file, the field path and what is expected.

A recipe may start from another one: `extends = "other.toml"` (docs/card.md "Recipes that extend
another"). The base is read first, the recipe's own keys are laid over it, and the result is validated
as one recipe, so an error names the file that set the field.
"""

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
EXTENDS_KEY = "extends"
MAX_EXTENDS_DEPTH = 8  # a chain longer than this is a mistake, not a design
# Arrays of tables merged by `id` instead of replaced: a derived recipe adds or changes a card warning,
# it never loses one (issue 34: the simulated recipe had silently lost 3 of the card's 22).
MERGED_BY_ID = frozenset({("findings",)})

FieldPath = tuple[str | int, ...]


@dataclass(frozen=True)
class RecipeIssue:
    path: str  # dotted field path, e.g. "profiles[1].env_add.BAD NAME"
    message: str
    file: Path | None = None  # the file that set the field, where it is not the file loaded (a base)


class RecipeError(ValueError):
    """A recipe could not be loaded. `issues` lists every problem found."""

    def __init__(self, file: Path, issues: list[RecipeIssue]) -> None:
        self.file = file
        self.issues = issues
        lines = [f"{i.file or file}: {i.path}: {i.message}" for i in issues]
        via = f" {file} (through {EXTENDS_KEY})" if any(i.file not in (None, file) for i in issues) else ""
        super().__init__(f"invalid recipe{via}\n  " + "\n  ".join(lines))


def _field_path(loc: FieldPath) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _loc_of(path: str) -> FieldPath:
    """`_field_path` reversed: 'profiles[2].env_add.X' → ('profiles', 2, 'env_add', 'X')."""
    return tuple(int(p[1:-1]) if p.startswith("[") else p for p in re.findall(r"\[\d+\]|[^.\[\]]+", path))


def _expected(err: dict[str, object]) -> str:
    kind = str(err.get("type", ""))
    msg = str(err.get("msg", "")).removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return "unknown key (not part of the recipe schema; check the spelling)"
    if kind == "missing":
        return "required key is missing"
    return msg


_PATH_PREFIX_RE = re.compile(r"^([A-Za-z_][\w.\[\]-]*): (.+)$", re.S)


def _issue(err: ErrorDetails) -> tuple[FieldPath, RecipeIssue]:
    """One pydantic error as a RecipeIssue; cross-field checks put their path in front of the message."""
    loc: FieldPath = tuple(err["loc"])
    path, message = _field_path(loc), _expected(err)  # type: ignore[arg-type]
    if path == "(top level)":
        m = _PATH_PREFIX_RE.match(message)
        if m:
            path, message = m.group(1), m.group(2)
            loc = _loc_of(path)
    return loc, RecipeIssue(path, message)


@dataclass
class _Layers:
    """A recipe's data with its `extends` chain laid over each other, and which file set which field."""

    data: dict[str, object]
    origin: dict[FieldPath, Path]  # a field path → the file whose value stands there (longest prefix wins)

    def file_of(self, loc: FieldPath) -> Path:
        for n in range(len(loc), -1, -1):
            if loc[:n] in self.origin:
                return self.origin[loc[:n]]
        raise AssertionError("the root path is always recorded")  # pragma: no cover


def _validate(layers: _Layers, file: Path) -> Recipe:
    try:
        return Recipe.model_validate(layers.data)
    except ValidationError as exc:
        issues = []
        for err in exc.errors():
            loc, issue = _issue(err)
            source = layers.file_of(loc)
            issues.append(RecipeIssue(issue.path, issue.message, None if source == file else source))
        raise RecipeError(file, issues) from None


def _read_toml(path: Path) -> dict[str, object]:
    try:
        if path.stat().st_size > MAX_TOML_BYTES:
            raise RecipeError(path, [RecipeIssue("(size)", f"refused: file is over {MAX_TOML_BYTES:,} bytes")])
        raw = path.read_bytes()
    except OSError as exc:
        raise RecipeError(path, [RecipeIssue("(file)", f"cannot read: {exc.strerror or exc}")]) from None
    try:
        return loads_bounded(raw.decode("utf-8"))
    except TomlLimitError as exc:
        raise RecipeError(path, [RecipeIssue("(size)", f"refused: {exc}")]) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise RecipeError(path, [RecipeIssue("(syntax)", f"not valid TOML: {exc}")]) from None


def base_file(ref: str, file: Path) -> Path:
    """Where `extends = ref` in `file` points: beside `file`; a bare name found only among the shipped
    recipes (assets/recipes/) means that one, so a copy of simulated.toml elsewhere still loads."""
    local = file.parent / ref
    if Path(ref).is_absolute() or local.exists() or Path(ref).name != ref:
        return local
    shipped = RECIPES_DIR / ref
    return shipped if shipped.exists() else local


def _merge(base: dict[str, object], over: dict[str, object], at: FieldPath, origin: dict[FieldPath, Path],
           file: Path) -> None:
    """Lay `over` on `base` in place: tables merge key by key (an empty one clears the base's), `MERGED_BY_ID`
    arrays merge by id, every other value replaces the base's."""
    for key, value in over.items():
        here, old = (*at, key), base.get(key)
        if isinstance(value, dict) and value and isinstance(old, dict):
            _merge(old, value, here, origin, file)
        elif here in MERGED_BY_ID and isinstance(value, list) and isinstance(old, list):
            index = {e.get("id"): i for i, e in enumerate(old) if isinstance(e, dict)}
            for entry in value:
                i = index.get(entry.get("id")) if isinstance(entry, dict) else None
                target = old[i] if i is not None else None
                if i is not None and isinstance(target, dict) and isinstance(entry, dict):
                    _merge(target, entry, (*here, i), origin, file)
                else:
                    origin[(*here, len(old))] = file
                    old.append(entry)
        else:
            for p in [p for p in origin if p[: len(here)] == here]:
                del origin[p]
            base[key] = value
            origin[here] = file


def _layers(file: Path, chain: tuple[Path, ...]) -> _Layers:
    data = _read_toml(file)
    if EXTENDS_KEY not in data:
        return _Layers(data, {(): file})
    ref = data.pop(EXTENDS_KEY)
    if not isinstance(ref, str) or not ref.strip():
        raise RecipeError(file, [RecipeIssue(EXTENDS_KEY, 'expected the file name of another recipe, e.g. '
                                             '"ds4-flash-0731-sm120.toml" (relative to this file\'s folder)')])
    base = base_file(ref, file)
    seen = [p.resolve() for p in (*chain, file)]
    if base.resolve() in seen:
        loop = " → ".join(p.name for p in (*chain[seen.index(base.resolve()):], file, base))
        raise RecipeError(file, [RecipeIssue(EXTENDS_KEY, f"recipes extend each other in a loop: {loop}")])
    if len(seen) >= MAX_EXTENDS_DEPTH:
        raise RecipeError(file, [RecipeIssue(EXTENDS_KEY, f"more than {MAX_EXTENDS_DEPTH} recipes deep")])
    if not base.is_file():
        raise RecipeError(file, [RecipeIssue(EXTENDS_KEY, f"no recipe at {base} (a path is relative to "
                                             f"{file.parent}; a bare name may also name one in {RECIPES_DIR})")])
    layers = _layers(base, (*chain, file))
    _merge(layers.data, data, (), layers.origin, file)
    return layers


def load_recipe(file: Path | str) -> Recipe:
    """Read a recipe TOML file (and the recipes it extends) and validate it.

    Raises:
        RecipeError: unreadable file, TOML syntax error, a bad `extends` chain, or any schema violation.
    """
    path = Path(file)
    try:
        layers = _layers(path, ())
    except RecipeError as exc:
        if exc.file == path:
            raise
        raise RecipeError(path, [RecipeIssue(i.path, i.message, i.file or exc.file) for i in exc.issues]) from None
    return _validate(layers, path)
