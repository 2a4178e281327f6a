"""How the panel writes sizes and durations, in the CLI and the tabs alike: GiB everywhere, as the card
(docs/downloads.md, "Progress")."""

from __future__ import annotations

GiB = 1 << 30


_SIZE_UNITS = {"": 1, "k": GiB >> 20, "m": GiB >> 10, "g": GiB, "t": GiB << 10}


def docker_size_bytes(text: str) -> int:
    """Docker's size form (`32g`, `512m`, `1024`; binary units, as `--shm-size`) in bytes; 0 when empty or
    unreadable."""
    t = text.strip().lower().removesuffix("b")
    unit = t[-1] if t and t[-1] in "kmgt" else ""
    num = t[:-1] if unit else t
    try:
        return int(float(num) * _SIZE_UNITS[unit]) if num else 0
    except ValueError:
        return 0


def gib_text(n: float) -> str:
    """Bytes as GiB; small amounts keep three decimals rather than reading 0.00."""
    return f"{n / GiB:.2f} GiB" if abs(n) >= 0.1 * GiB or n == 0 else f"{n / GiB:.3f} GiB"


def duration_text(seconds: float | None) -> str:
    """`1h02m` from an hour on, else `3m05s`; `—` when unknown."""
    if seconds is None:
        return "—"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
