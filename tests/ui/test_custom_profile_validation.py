"""The custom-profile editor refuses what the card rules out and names every problem at once (issue 29):
--max-num-seqs 0, a context past the card's validated ceiling, invalid JSON in --speculative-config."""

from __future__ import annotations

import dataclasses

import pytest

import app.backend.profiles.custom as cp
from app.backend.recipe import SIMULATED_RECIPE, load_recipe

RECIPE = load_recipe(SIMULATED_RECIPE)
BASE = RECIPE.profile("balanced")


def _form(**changes: object) -> cp.EditorForm:
    return dataclasses.replace(cp.form_from_profile(RECIPE, BASE), **changes)


def test_every_problem_is_named_at_once() -> None:
    form = _form(max_num_seqs="0", max_model_len="300000", speculative='{"method": "mtp",', promo_hyst="eight")
    with pytest.raises(cp.CustomProfileError) as err:
        cp.profile_from_form(RECIPE, BASE, "bad", form, set(), strict=True)
    msg = str(err.value)
    assert msg.startswith("4 problems:"), msg
    for part in ("VLLM_MOE_W2_PROMO_HYST must be a whole number", "--max-model-len 300000 is outside 1–262,144",
                 "--max-num-seqs must be at least 1", "--speculative-config must be a JSON object"):
        assert part in msg, (part, msg)


@pytest.mark.parametrize(("changes", "match"), [
    ({"max_num_seqs": "0"}, "--max-num-seqs must be at least 1"),
    ({"max_model_len": "262145"}, "outside 1–262,144"),
    ({"max_model_len": ""}, "--max-model-len needs a value"),
    ({"speculative": "[1, 2]"}, "must be a JSON object"),
    ({"speculative": "mtp"}, "must be a JSON object"),
])
def test_refused_when_saving(changes: dict[str, object], match: str) -> None:
    with pytest.raises(cp.CustomProfileError, match=match):
        cp.profile_from_form(RECIPE, BASE, "bad", _form(**changes), set(), strict=True)


def test_sane_values_are_saved() -> None:
    p = cp.profile_from_form(RECIPE, BASE, "ok", _form(max_num_seqs="2", max_model_len="131072",
                                                         speculative='{"method": "mtp", "num_speculative_tokens": 1}'),
                             set(), strict=True)
    assert p.args_set["--max-num-seqs"] == "2" and p.args_set["--max-model-len"] == "131072"
