"""Issue 49: a custom profile the card calls an ERROR is not saved without asking; `Save anyway` saves it."""

from __future__ import annotations

from pathlib import Path

from app.backend.config.settings import resolve_settings
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.state import AppState
from app.ui.profiles import _View


def _form(view: _View, base: str, **change: object) -> list[object]:
    vals = view.load_form(base)  # policy, hyst, promote, gb, gate, mml, eager, spec, extra, seqs, expert
    names = ["policy", "hyst", "promote", "gb", "gate", "mml", "eager", "spec", "extra", "seqs", "expert"]
    return [change.get(n, v) for n, v in zip(names, vals, strict=True)]


def test_an_error_finding_asks_before_saving(tmp_path: Path) -> None:
    view = _View(AppState(settings=resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True)))
    folder = tmp_path / ".moet-panel" / "profiles"
    big = _form(view, "quality", gb="10")  # the walk's case: "ERROR 10 GiB does not fit at 256K"
    out = view.save("quality", "Big pool", False, *big)
    assert "Not saved yet" in out[3] and "pool-10gib" in out[3], out[3]
    assert "does not fit at 256K" in out[2]  # the card's words shown beside the question
    assert out[4]["visible"] is True and not (folder / "big-pool.toml").exists()
    out = view.save("quality", "Big pool", False, *big, anyway=True)
    assert "Saved custom profile" in out[3] and out[4]["visible"] is False
    assert (folder / "big-pool.toml").exists()
    fine = view.save("quality", "Smaller pool", False, *_form(view, "quality", gb="6"))
    assert "Saved custom profile" in fine[3], fine[3]  # no ERROR: saved on the first click, as before
