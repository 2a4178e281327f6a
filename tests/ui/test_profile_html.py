"""Profile cards, chart and tables: the card's figures, and user text always escaped."""

from __future__ import annotations

import re

from app.backend import custom_profiles as cp
from app.backend.recipe import SIMULATED_RECIPE, load_recipe
from app.ui.profile_html import figures, profile_cards, speed_quality_chart, study_tables

RECIPE = load_recipe(SIMULATED_RECIPE)
EVIL = '<img src=x onerror="alert(1)"> & </li><script>alert(2)</script>'


def _custom():
    base = RECIPE.profile("balanced")
    return cp.profile_from_form(RECIPE, base, EVIL, cp.form_from_profile(RECIPE, base), set())


def test_custom_profile_text_is_escaped_everywhere() -> None:
    custom = _custom()
    profiles = [*RECIPE.profiles, custom]
    html = profile_cards(RECIPE, profiles, custom.id, {}) + speed_quality_chart(RECIPE, profiles, custom.id)
    assert "<script" not in html and "<img" not in html and "&lt;script&gt;" in html


def test_custom_profile_shows_not_measured_and_is_not_plotted() -> None:
    custom = _custom()
    assert figures(custom) == {"decode": "not measured", "quality": "not measured", "delta": "not measured"}
    svg = speed_quality_chart(RECIPE, [*RECIPE.profiles, custom], "quality")
    assert svg.count("<circle") == 3 and "not measured and not plotted" in svg


def test_chart_has_ci_bars_frontier_and_a_text_description() -> None:
    svg = speed_quality_chart(RECIPE, list(RECIPE.profiles), "balanced")
    assert 'role="img"' in svg and "75 tok/s, Δ -1.37" in svg and "83.2 tok/s, Δ -7.20" in svg
    assert len(re.findall(r"<polyline", svg)) == 1  # the frontier
    assert svg.count('stroke-width="1.5"') == 2  # one CI bar per profile with a delta (2 and 3)
    assert "SIMULATED" in svg


def test_study_tables_render_every_row() -> None:
    html = study_tables(RECIPE.studies)
    assert html.count("<table>") == len(RECIPE.studies)
    assert html.count("<tr>") == sum(len(s.rows) + 1 for s in RECIPE.studies)
