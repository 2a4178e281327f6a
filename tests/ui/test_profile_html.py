"""Profile cards, chart and tables: the card's figures, and user text always escaped."""

from __future__ import annotations

import re

from app.backend.profiles import custom as cp
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
    assert 'role="img"' in svg and "75.0 tok/s, Δ -1.37" in svg and "83.2 tok/s, Δ -7.20" in svg
    assert len(re.findall(r"<polyline", svg)) == 1  # the frontier
    assert svg.count('stroke-width="1.5"') == 2  # one CI bar per profile with a delta (2 and 3)
    assert "SIMULATED" in svg


def test_study_tables_render_every_row() -> None:
    html = study_tables(RECIPE.studies)
    assert html.count("<table>") == len(RECIPE.studies)
    assert html.count("<tr>") == sum(len(s.rows) + 1 for s in RECIPE.studies)


def test_figures_are_printed_as_the_card_states_them() -> None:
    from app.backend.recipe import DEFAULT_RECIPE

    card = load_recipe(DEFAULT_RECIPE)
    assert figures(card.profile("balanced"))["decode"] == "75.0 tok/s"  # not "75"
    html = study_tables(card.studies)
    for text in ("~76", "~25", "11.00", "4.90", "75.0", "33.0", "−1.37", "0.047"):
        assert f'<td class="num">{text}</td>' in html, text
    assert '<td class="num">76</td>' not in html and '<td class="num">11</td>' not in html and '<td class="num">4.9</td>' not in html
    assert "freq default*" in html and 'class="moet-footnote">* VLLM_MOE_W2_DELTA_POLICY silently defaults' in html
    for stat in ("F(11,23)=9.43", "killed at 21 min", "Leave-one-seed-out spans only −1.08 to −1.75",
                 "Still not established", "2. Without it, this stack is pointless", "4. Throughput still favours production"):
        assert stat in html, stat


def test_profile_cards_carry_the_figure_notes() -> None:
    html = profile_cards(RECIPE, list(RECIPE.profiles), "quality", {})
    for note in ("P(true effect is a real loss) ≈ 0.97", "reproducible to ±1 tok/s across seeds",
                 "conservative rung-blocked CI [−2.93, +0.19]"):
        assert note in html, note
    assert html.count('data-fignote="decode"') == 3


def test_explained_command_puts_the_cards_reason_beside_each_line() -> None:
    from app.backend.recipe import DEFAULT_RECIPE
    from app.backend.recipe.command import build_run_spec, explain_lines
    from app.ui.profile_html import explained_command

    card = load_recipe(DEFAULT_RECIPE)
    lines = explain_lines(card, build_run_spec(card, "quality", "/data/ds4"))
    by_text = {e.text: e for e in lines}
    assert by_text["-e VLLM_USE_BREAKABLE_CUDAGRAPH=0"].why.endswith("restores VLLM_COMPILE (+5%).")
    assert by_text["--max-num-seqs 1"].source == "card" and by_text["--kv-cache-dtype fp8"].source == "card"
    assert by_text["-e VLLM_MOE_W2_DELTA_TRACE=1"].source == "panel"
    # the card's own port line stays, explained by the panel: the engine listens on its socket (issue 40)
    assert by_text["--port 8000"].source == "panel" and "ignored" in by_text["--port 8000"].why
    env_lines = [e for e in lines if e.text.startswith("-e ") and e.source != "panel"]
    assert env_lines and all(e.source == "card" for e in env_lines)  # every env of the base command has its reason
    html = explained_command(lines)
    assert html.count("<tr data-why-source=") == len(lines) and "the card gives no reason for this line" in html


def test_card_facts_show_context_vram_pins_requirements_and_regeneration() -> None:
    from app.backend.recipe import DEFAULT_RECIPE
    from app.ui.profile_html import card_facts

    card = load_recipe(DEFAULT_RECIPE)
    html = card_facts(card)
    for text in ("depths 0.05 / 0.50 / 0.95", "0/3 depths", "72.6 GiB of 2-bit planes", card.model.revision, card.engine.commit,
                 "tsym4-e8m0-fragmajor-a32-v2", "will not work on a multi-GPU split", "≥ 128 GiB", "TP1",
                 "VLLM_MOE_W2_BASE_CACHE_GB=14", "~13 min", "does not start that boot", "min_p=0.05", "bit-identical"):
        assert text in html, text
