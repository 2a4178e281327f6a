"""Engine builds the panel holds (issue 45; docs/engine.md "Upgrading the engine"): the registry, the image a
start runs, promote/rollback as a local pin override, A/B sides on builds, the SIMULATED `next` variant."""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path

import pytest

from app.backend.abtest.runner import split_side
from app.backend.engine.builds import store as builds
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.recipe.command import build_run_spec
from app.backend.config.settings import Settings
from app.backend.simengine.config import config_from_env_and_args
from app.backend.simengine.quality import broken_length
from app.cli.main import main


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    from app.backend.recipe import load_recipe

    return Settings(SIMULATED_RECIPE, load_recipe(SIMULATED_RECIPE), tmp_path / "data", True)


def _next(reg: builds.BuildRegistry) -> builds.Build:
    b = builds.Build("next", "next", "moet-panel/sim-engine:next", reg.recipe_id, 1.0, 123, simulated=True,
                     variant="next")
    reg.add(b)
    return b


def _cli(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(list(args))
    return rc, out.getvalue()


def test_pin_is_current_until_a_promotion_and_rollback_returns(settings: Settings) -> None:
    reg = builds.registry(settings)
    assert [v.build.id for v in reg.views() if v.current] == ["pin"]
    assert reg.image_for(None) == settings.recipe.engine.image
    _next(reg)
    reg.add_evidence("next", builds.Evidence("selftest", "run1", 2.0, "quality: decode 51.8 tok/s"))
    recipe_before = SIMULATED_RECIPE.read_bytes()
    p = reg.promote("next", "cli")
    assert reg.current_id() == "next" and reg.image_for(None) == "moet-panel/sim-engine:next"
    assert p.previous == "pin" and [e.ref for e in p.evidence] == ["run1"] and p.who == "cli"
    assert reg.override_path.parent == settings.state_dir and reg.override_path.exists()
    assert SIMULATED_RECIPE.read_bytes() == recipe_before  # the recipe file itself is never edited
    with pytest.raises(ValueError, match="already current"):
        reg.promote("next", "cli")
    assert reg.rollback("cli").build == "next" and reg.current_id() == "pin"
    with pytest.raises(ValueError, match="nothing to roll back"):
        reg.rollback("cli")


def test_unknown_build_is_refused_with_the_known_ones(settings: Settings) -> None:
    with pytest.raises(builds.UnknownBuild, match="known: pin"):
        builds.registry(settings).resolve("nope")


def test_a_rebuild_keeps_the_evidence(settings: Settings) -> None:
    reg = builds.registry(settings)
    _next(reg)
    reg.add_evidence("next", builds.Evidence("abtest", "ab1", 2.0))
    _next(reg)
    assert [e.ref for e in reg.get("next").evidence] == ["ab1"]


def test_run_spec_runs_the_builds_image_and_labels_it(settings: Settings) -> None:
    spec = build_run_spec(settings.recipe, "quality", str(settings.data_dir), image="x/engine:abc1234",
                          build="abc1234")
    assert spec.image == "x/engine:abc1234" and spec.labels_dict["moet-panel.build"] == "abc1234"
    assert build_run_spec(settings.recipe, "quality", str(settings.data_dir)).image == settings.recipe.engine.image


def test_command_prints_the_current_builds_image(settings: Settings) -> None:
    common = ("--demo", "--data-dir", str(settings.data_dir))
    pin_image = settings.recipe.engine.image
    rc, out = _cli("command", "--profile", "quality", *common)
    assert rc == 0 and f"{pin_image} \\" in out
    reg = builds.registry(settings)
    _next(reg)
    assert "moet-panel/sim-engine:next" in _cli("command", "--profile", "quality", "--build", "next", *common)[1]
    reg.promote("next", "test")
    out = _cli("command", "--profile", "quality", *common)[1]
    assert "moet-panel/sim-engine:next \\" in out and "moet-panel.build=next" in out
    reg.rollback("test")
    assert f"{pin_image} \\" in _cli("command", "--profile", "quality", *common)[1]


def test_builds_json_lists_id_commit_image_current_evidence_size_date(settings: Settings) -> None:
    reg = builds.registry(settings)
    _next(reg)
    reg.add_evidence("pin", builds.Evidence("selftest", "s1", 3.0))
    rc, out = _cli("engine", "builds", "--json", "--demo", "--data-dir", str(settings.data_dir))
    rows = {r["id"]: r for r in json.loads(out)}
    assert rc == 0 and rows["pin"]["current"] and not rows["next"]["current"]
    assert rows["next"]["image"] == "moet-panel/sim-engine:next" and rows["next"]["size_bytes"] == 123
    assert rows["next"]["built_at"] == 1.0 and rows["next"]["commit"] == "next"
    assert [e["ref"] for e in rows["pin"]["evidence"]] == ["s1"]


def test_ab_side_is_profile_at_build() -> None:
    assert split_side("quality@next") == ("quality", "next")
    assert split_side("quality") == ("quality", None)


def test_simulated_next_variant_is_a_little_faster_and_a_little_worse() -> None:
    base = config_from_env_and_args([], {"MOET_SIM_DECODE_TOK_S": "50"})
    nxt = config_from_env_and_args([], {"MOET_SIM_DECODE_TOK_S": "50", "MOET_SIM_BUILD": "next"})
    assert base.decode_tok_s == 50 and nxt.decode_tok_s == pytest.approx(53.0) and nxt.build == "next"
    with pytest.raises(ValueError, match="MOET_SIM_BUILD"):
        config_from_env_and_args([], {"MOET_SIM_BUILD": "bogus"})
    rng = random.Random(1)
    cuts_pin = [broken_length(rng, 0, 200) for _ in range(200)]
    cuts_next = [broken_length(rng, 0, 200, "next") for _ in range(200)]
    assert all(c is None for c in cuts_pin) and 10 < sum(c is not None for c in cuts_next) < 80


def test_chat_stats_line_and_header_name_the_build(tmp_path: Path) -> None:
    from app.backend.chat.models import MessageStats
    from app.backend.chat.stats import format_stats
    from app.backend.contracts import EngineSnapshot, EngineState
    from app.backend.config.settings import resolve_settings
    from app.backend.state import AppState
    from app.ui.header import header_html

    line = format_stats(MessageStats(profile_id="quality", build="next", decode_tok_s=51.0, completion_tokens=3))
    assert line.startswith("profile quality · build next · ")
    assert "build" not in format_stats(MessageStats(profile_id="quality"))
    state = AppState(settings=resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True))
    html = header_html(state, EngineSnapshot(state=EngineState.READY, profile_id="quality", build="next"), None)
    assert 'data-build="next"' in html and "build next" in html


def test_compare_tab_offers_profiles_on_each_candidate_build(settings: Settings) -> None:
    reg = builds.registry(settings)
    assert builds.side_choices(settings, ["quality", "speed"]) == ["quality", "speed"]
    _next(reg)
    assert builds.side_choices(settings, ["quality", "speed"]) == ["quality", "speed", "quality@next", "speed@next"]
    reg.promote("next", "test")  # the pin is the candidate now
    assert builds.side_choices(settings, ["quality"]) == ["quality", "quality@pin"]


def test_evidence_side_by_side_from_this_boxs_runs(settings: Settings) -> None:
    from app.backend.abtest.grading import grade_from_pick
    from app.backend.abtest.journal import Generation, Journal, new_spec
    from app.backend.evidence.builds import compare
    from app.backend.selftest.store import ResultsStore
    from app.backend.selftest.types import DecodeRun, NeedleOutcome, SelfTestResult, TelemetrySummary

    reg = builds.registry(settings)
    assert compare(settings).candidate is None
    _next(reg)
    store = ResultsStore(settings.ensure_state_dir())
    for build, rate, date in (("pin", 48.0, "2026-01-01T00:00:00+00:00"), ("next", 51.0, "2026-01-01T00:01:00+00:00")):
        store.save(SelfTestResult("quality", "img", "h", date, True, 48.9, {}, [DecodeRun(rate, 100, 0.2, None)], [],
                                  [NeedleOutcome(65536, 0.5, 65000, "AB-1234", True, "AB-1234")],
                                  TelemetrySummary(vram_peak_gib=93.8, coverage_pct=57.0), 1.0, build))
    reg.add_evidence("next", builds.Evidence("boot", "quality", 1.0, "12.5"))
    reg.add_evidence("next", builds.Evidence("failure", "quality", 2.0, "CUDA out of memory at load"))
    journal = Journal(settings.state_dir)
    spec = new_spec("quality", "quality@next", ["p"], [1, 2], 64)
    journal.create(spec)
    for side in ("A", "B"):
        for seed in (1, 2):
            journal.append(spec.run_id, Generation(side, "p1", seed, "x", 1, None, 0.1, "stop"))
    st = journal.load(spec.run_id)
    for (pid, seed), pick in zip(st.spec.cells, ("left", "right"), strict=True):
        journal.append(spec.run_id, grade_from_pick(st, pid, seed, pick))
    c = compare(settings, "next")
    assert (c.current.build.id, c.current.decode_tok_s, c.current.card_tok_s) == ("pin", 48.0, 48.9)
    assert c.candidate is not None and (c.candidate.decode_tok_s, c.candidate.needles) == (51.0, "1/1 found")
    assert (c.candidate.vram_gib, c.candidate.coverage_pct, c.candidate.boot_s) == (93.8, 57.0, 12.5)
    assert c.candidate.failures == ("CUDA out of memory at load",) and c.current.failures == ()
    assert c.ab is not None and c.ab.pairs == 2 and "90% CI" in c.ab.headline
    assert compare(settings, "gone").candidate is not None  # a stale pick falls back to the newest candidate
