"""Parse TOML with a size and nesting bound, so hostile files fail with a clear error.

`tomllib` recurses once per nested array/inline table: a few kilobytes of `[[[[…` raise an uncaught
RecursionError deep inside the parser. A recipe or custom profile is never more than a few levels deep,
so the text is scanned first (strings and comments skipped) and refused above `max_depth`; the parsed
data is checked again, and RecursionError is turned into the same error as a last guard.
"""

from __future__ import annotations

import tomllib
from typing import Any

MAX_TOML_BYTES = 1_000_000  # the card's recipe is ~25 kB
MAX_TOML_DEPTH = 16  # the recipe schema nests 4 levels deep (studies → rows → row → cell table)


class TomlLimitError(ValueError):
    """The text is too large or too deeply nested to be a recipe or profile."""


def _bracket_depth(text: str) -> int:
    """Deepest nesting of [ and { outside strings and comments (table headers open and close on one line)."""
    depth = deepest = 0
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if c in "\"'":
            triple = text.startswith(c * 3, i)
            quote = c * 3 if triple else c
            j = i + len(quote)
            while j < n:
                if c == '"' and text[j] == "\\":
                    j += 2
                    continue
                if text.startswith(quote, j):
                    break
                if not triple and text[j] == "\n":
                    break
                j += 1
            i = j + len(quote)
            continue
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth = max(0, depth - 1)
        i += 1
    return deepest


def _data_depth(value: object, level: int = 0) -> int:
    if level > MAX_TOML_DEPTH:
        return level
    if isinstance(value, dict):
        return max([_data_depth(v, level + 1) for v in value.values()] or [level + 1])
    if isinstance(value, list):
        return max([_data_depth(v, level + 1) for v in value] or [level + 1])
    return level


def loads_bounded(text: str, *, max_bytes: int = MAX_TOML_BYTES, max_depth: int = MAX_TOML_DEPTH) -> dict[str, Any]:
    """`tomllib.loads` with limits.

    Raises:
        TomlLimitError: over `max_bytes` (UTF-8) or nested deeper than `max_depth`.
        tomllib.TOMLDecodeError: a syntax error.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise TomlLimitError(f"file is {size:,} bytes; the limit is {max_bytes:,} bytes")
    if _bracket_depth(text) > max_depth:
        raise TomlLimitError(f"arrays/inline tables nested more than {max_depth} levels deep")
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise TomlLimitError(f"nested more than {max_depth} levels deep") from None
    if _data_depth(data) > max_depth:
        raise TomlLimitError(f"tables nested more than {max_depth} levels deep")
    return data
