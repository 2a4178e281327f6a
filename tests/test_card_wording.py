"""Wording audit (issue 16): every sentence the panel presents as the model card's is in the card it ships.

Two kinds of claim are checked against docs/model-card.txt (whitespace-normalised, so the card's tab-separated
table rows compare as single-spaced text):
- recipe fields that hold the card's words (notes, findings, "why each knob", studies, context, pins, …); a
  field may join several card passages with " … ", and each passage must be in the card;
- every “curly-quoted” span in the panel's Python sources: that is how code texts mark the card's own words.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.backend.recipe import DEFAULT_RECIPE, SIMULATED_RECIPE, load_recipe
from app.backend.recipe.schema import Recipe, cell_text

ROOT = Path(__file__).resolve().parents[1]
CARD_FILE = ROOT / "docs" / "model-card.txt"
SEP = " … "


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


CARD = _norm(CARD_FILE.read_text(encoding="utf-8"))


def _claims(r: Recipe) -> Iterator[tuple[str, str]]:
    """(where, text) for every recipe field that claims the card's words."""
    for p in r.profiles:
        for i, n in enumerate(p.notes):
            yield f"profiles.{p.id}.notes[{i}]", n
        for name in ("decode", "quality"):
            fig = getattr(p, name)
            if fig:
                yield f"profiles.{p.id}.{name}.note", fig.note
                yield f"profiles.{p.id}.{name}.text", fig.shown
        if p.delta_vs_1:
            yield f"profiles.{p.id}.delta_vs_1.note", p.delta_vs_1.note
        yield f"profiles.{p.id}.summary", p.summary
        yield f"profiles.{p.id}.scheduler_setting", p.scheduler_setting
    for f in r.findings:
        yield f"findings.{f.id}", f.message
    for k, v in r.why.items():
        yield f"why.{k}", v
    yield "context.note", r.context.note
    if r.context.needles_title:
        yield "context.needles_title", r.context.needles_title
    for n in r.context.needles:
        yield f"context.needles.{n.length}", f"{n.length} {n.result}"
        if n.note:
            yield f"context.needles.{n.length}.note", n.note
    yield "vram.note", r.vram.note
    yield "sampling.note", r.sampling.note
    yield "sampling.never_zero_note", r.sampling.never_zero_note
    req = r.requirements
    for name in ("ecc_note", "host_ram_note", "multi_gpu_note"):
        if getattr(req, name):
            yield f"requirements.{name}", getattr(req, name)
    if not r.simulated:
        yield "model.params_note", r.model.params_note
    if r.regenerate:
        yield "regenerate.note", r.regenerate.note
    for k, v in r.pins.items():
        yield f"pins.{k}", f"{k} {v}"
    for s in r.studies:
        yield f"studies.{s.id}.title", s.title
        yield f"studies.{s.id}.columns", " ".join(s.columns)
        for i, row in enumerate(s.rows):
            yield f"studies.{s.id}.rows[{i}]", " ".join(cell_text(c) for c in row)
        for name in ("note",):
            if s.note:
                yield f"studies.{s.id}.{name}", s.note
        for i, d in enumerate(s.details):
            yield f"studies.{s.id}.details[{i}]", d
        for i, d in enumerate(s.footnotes):
            yield f"studies.{s.id}.footnotes[{i}]", d


def _missing(claims: Iterator[tuple[str, str]]) -> list[str]:
    out = []
    for where, text in claims:
        for part in text.split(SEP):
            if _norm(part) and _norm(part) not in CARD:
                out.append(f"{where}: {part!r}")
    return out


@pytest.mark.parametrize("recipe_file", [DEFAULT_RECIPE, SIMULATED_RECIPE], ids=["card", "simulated"])
def test_every_recipe_text_that_claims_the_card_is_in_the_shipped_card(recipe_file: Path) -> None:
    r = load_recipe(recipe_file)
    claims = list(_claims(r))
    assert len(claims) > 100  # the audit really covers the recipe
    assert _missing(iter(claims)) == []


def test_the_recipe_cites_the_card_file_the_repo_ships() -> None:
    r = load_recipe(DEFAULT_RECIPE)
    assert r.card_file == "docs/model-card.txt" and (ROOT / r.card_file).is_file()
    sources = [DEFAULT_RECIPE, ROOT / "app/backend/engine/logs/diagnosis.py", ROOT / "tests/test_command.py"]
    for path in sources:
        assert "shared/seed/model-card.txt" not in path.read_text(), path


_QUOTE_RE = re.compile(r"“([^”]+)”")


def _code_quotes() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "app").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        # join implicitly concatenated string literals so a quote split across source lines reads whole
        joined = re.sub(r'"\s*\n\s*(?:f|rf|fr)?"', "", text)
        for m in _QUOTE_RE.finditer(joined):
            yield f"{path.relative_to(ROOT)}", m.group(1)


def test_every_curly_quoted_card_claim_in_the_code_is_in_the_card() -> None:
    quotes = list(_code_quotes())
    assert len(quotes) >= 10
    assert _missing(iter(quotes)) == []


def test_the_audit_catches_an_invented_quote() -> None:
    assert _missing(iter([("x", "Leave it off in every profile.")])) == []
    assert _missing(iter([("x", "Set GATE_TAU and GATE_FP_MAX explicitly if you enable the gate at all.")])) != []
    assert _missing(iter([("x", "do not enlarge VLLM_MOE_W2_DELTA_GB beyond 7")])) != []
