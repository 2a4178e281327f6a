"""The effective command of a profile: the engine's env and arguments after the profile's changes.

The one reading of an engine argv in the panel (docs/card.md, "The effective command"): the spec builder,
the shell rendering, the explanations, the card's finding conditions, custom-profile checks, the self-test
and the alert policy all ask this object, so none of them parses argv on its own. The rule: an argument
starting with `--` takes the next token as its value unless that token starts with `--` too (vLLM's own
flags; a value never starts with `-`, schema.ProfileSpec); any other token stands alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# (argument, value); value None = a bare flag or a token that stands alone
ArgItem = tuple[str, str | None]


def arg_items(args: Iterable[str]) -> tuple[ArgItem, ...]:
    """`args` grouped as (flag, value) by the rule above, in order."""
    tokens = list(args)
    out: list[ArgItem] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.startswith("--") and i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            out.append((tok, tokens[i + 1]))
            i += 2
        else:
            out.append((tok, None))
            i += 1
    return tuple(out)


def _flatten(items: Iterable[ArgItem]) -> tuple[str, ...]:
    return tuple(tok for flag, value in items for tok in ((flag,) if value is None else (flag, value)))


@dataclass(frozen=True)
class EffectiveCommand:
    """Engine env (in the card's order) and engine arguments; every change returns a new command."""

    env: tuple[tuple[str, str], ...] = ()
    args: tuple[str, ...] = ()

    @classmethod
    def of(cls, env: Mapping[str, str] | Iterable[tuple[str, str]], args: Iterable[str]) -> EffectiveCommand:
        pairs = env.items() if isinstance(env, Mapping) else env
        return cls(env=tuple((str(k), str(v)) for k, v in pairs), args=tuple(args))

    # --- env --------------------------------------------------------------------------------------
    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)

    def has_env(self, name: str) -> bool:
        return any(k == name for k, _ in self.env)

    def env_value(self, name: str) -> str | None:
        """The value docker would pass (the last `-e` of that name wins), None when not set."""
        return self.env_dict.get(name)

    def set_env(self, name: str, value: str) -> EffectiveCommand:
        """Replace the value in place (the card's order kept), or append a new variable."""
        if not self.has_env(name):
            return EffectiveCommand(self.env + ((name, value),), self.args)
        return EffectiveCommand(tuple((k, value if k == name else v) for k, v in self.env), self.args)

    def remove_env(self, name: str) -> EffectiveCommand:
        return EffectiveCommand(tuple((k, v) for k, v in self.env if k != name), self.args)

    # --- args -------------------------------------------------------------------------------------
    def arg_items(self) -> tuple[ArgItem, ...]:
        return arg_items(self.args)

    def has_arg(self, flag: str) -> bool:
        return any(f == flag for f, _ in self.arg_items())

    def arg_value(self, flag: str) -> str | None:
        """The value of the first `flag`; None when absent or bare (ask has_arg to tell them apart)."""
        return next((v for f, v in self.arg_items() if f == flag), None)

    def set_arg(self, flag: str, value: str = "") -> EffectiveCommand:
        """Each `flag` gets `value` in place ("" = bare flag), or the flag is appended when absent."""
        new: ArgItem = (flag, value or None)
        items = self.arg_items()
        if not any(f == flag for f, _ in items):
            return EffectiveCommand(self.env, _flatten((*items, new)))
        return EffectiveCommand(self.env, _flatten(new if f == flag else (f, v) for f, v in items))

    def remove_arg(self, flag: str) -> EffectiveCommand:
        """Every `flag` dropped, with its value."""
        return EffectiveCommand(self.env, _flatten((f, v) for f, v in self.arg_items() if f != flag))
