"""What the Engine tab's "Apply to" names on a box of several GPUs (docs/engine.md "Several GPUs"): one GPU, or
every GPU. Shared by the Engine tab's buttons and its builds section (serve a candidate where chosen)."""

from __future__ import annotations

EVERY_GPU = "every GPU"


def gpu_choice(gpu: int) -> str:
    return f"GPU {gpu}"


def scope_gpus(where: str | None, gpus: list[int]) -> list[int] | None:
    """What "Apply to" names: every GPU (None: all, a switch then rolls), else the one GPU chosen (the first GPU
    for a choice that names none of these)."""
    if where == EVERY_GPU:
        return None
    for g in gpus:
        if where == gpu_choice(g):
            return [g]
    return [gpus[0]]
