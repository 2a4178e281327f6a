"""The gateway's caps an owner changes from the Access tab while it serves (docs/gateway.md#caps).

Two of the gateway's limits are the owner's to set for a shared box: the most `max_tokens` a request may ask
(for keys without their own cap) and a key's time on the engine's sequences while another key waits (the hold
cap). The panel keeps the owner's choice in `gateway.json` (switch.DesiredGateway) and tells a running gateway
process the values in force as one JSON line on its stdin — the pipe the engine's status already takes — so a
change applies to the next request without a restart (a restart would cut the answers being read).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

HOLD_MIN_S = 10.0  # below this a long answer beside a waiting key could not finish a paragraph
HOLD_MAX_S = 86_400.0


class CapsError(ValueError):
    """A cap the gateway cannot take; the message says what it takes."""


@dataclass(frozen=True)
class GatewayCaps:
    """The caps in force: concrete values (the panel resolves the recipe's defaults before sending)."""

    max_tokens: int
    max_hold_s: float

    def to_line(self) -> bytes:
        """One JSON line for the gateway process's stdin (engine_status.PipeSource reads it)."""
        return (json.dumps({"caps": {"max_tokens": self.max_tokens, "max_hold_s": self.max_hold_s}},
                           separators=(",", ":")) + "\n").encode()

    @classmethod
    def from_obj(cls, obj: object) -> GatewayCaps:
        """The `caps` object of such a line; raises CapsError when it is not one."""
        if not isinstance(obj, dict):
            raise CapsError("not a caps object")
        n, hold = obj.get("max_tokens"), obj.get("max_hold_s")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise CapsError(f"caps: max_tokens {n!r} is not a positive whole number")
        if isinstance(hold, bool) or not isinstance(hold, (int, float)) or not math.isfinite(hold) or hold <= 0:
            raise CapsError(f"caps: max_hold_s {hold!r} is not a positive number of seconds")
        return cls(n, float(hold))


def check_caps(max_tokens: float | None, max_hold_s: float | None, context_tokens: int) -> tuple[int | None, float | None]:
    """The owner's typed caps, checked: None keeps the recipe's default. Raises CapsError with what is allowed."""
    tokens: int | None = None
    if max_tokens is not None:
        if not math.isfinite(max_tokens) or max_tokens != int(max_tokens) or not 1 <= max_tokens <= context_tokens:
            raise CapsError(f"max tokens a request: {max_tokens:g} is not a whole number from 1 to {context_tokens:,} "
                            "(the engine's context); 0 or empty: the default")
        tokens = int(max_tokens)
    hold: float | None = None
    if max_hold_s is not None:
        if not math.isfinite(max_hold_s) or not HOLD_MIN_S <= max_hold_s <= HOLD_MAX_S:
            raise CapsError(f"hold cap: {max_hold_s:g} s is not from {HOLD_MIN_S:g} to {HOLD_MAX_S:g} seconds; "
                            "0 or empty: the default")
        hold = float(max_hold_s)
    return tokens, hold
