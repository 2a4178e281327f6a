"""A/B: journal + resume (unit), blind pairing, and a 2 prompts × 1 seed run on the SIMULATED engine."""

from __future__ import annotations

import json
import time

import pytest

from app.backend.abtest.grading import a_is_left, blind_pairs, grade_from_pick, grade_from_scores, reveal
from app.backend.abtest.journal import Generation, Journal, new_spec, parse_pasted, parse_prompts_jsonl
from app.backend.abtest.runner import ABRunService
from app.backend.jobs import JobState
from tests.selftest.conftest import FAST_ENV, start_ready


def _gen(side, pid, seed, text="x"):
    return Generation(side, pid, seed, text, 10, 50.0, 0.2, "stop")


def test_journal_survives_a_torn_line_and_resumes_the_missing_cells(tmp_path) -> None:
    j = Journal(tmp_path)
    spec = new_spec("quality", "balanced", ["first", "second"], [42, 43], 256)
    j.create(spec)
    j.append(spec.run_id, _gen("A", "p1", 42))
    j.append(spec.run_id, _gen("A", "p2", 42))
    with open(j.path(spec.run_id), "a") as fh:
        fh.write('{"type": "gen", "side": "A", "prom')  # the panel died mid-write
    st = j.load(spec.run_id)
    assert st.spec == spec and st.generated == 2 and st.total == 8
    assert st.missing("A") == [("p1", 43), ("p2", 43)]
    assert len(st.missing("B")) == 4
    assert j.runs() == [spec.run_id]
    with pytest.raises(KeyError, match="no A/B run"):
        j.load("20990101T000000-abcdef")
    with pytest.raises(ValueError, match="not a run id"):
        j.path("../etc/passwd")


def test_spec_and_prompt_parsing_errors_are_actionable() -> None:
    with pytest.raises(ValueError, match="two different profiles"):
        new_spec("quality", "quality", ["x"], [1], 100)
    with pytest.raises(ValueError, match="distinct seeds"):
        new_spec("quality", "speed", ["x"], [1, 1], 100)
    with pytest.raises(ValueError, match="no prompts"):
        new_spec("quality", "speed", ["  "], [1], 100)
    assert parse_prompts_jsonl('{"prompt": "a"}\n\n"b"\n') == ["a", "b"]
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        parse_prompts_jsonl('{"prompt": "a"}\nnot json')
    assert parse_pasted("one\nline two\n---\nthree\n") == ["one\nline two", "three"]


def test_blind_sides_are_shuffled_and_grades_map_back_to_b_minus_a(tmp_path) -> None:
    j = Journal(tmp_path)
    spec = new_spec("quality", "speed", [f"q{i}" for i in range(8)], [1, 2], 64)
    j.create(spec)
    for pid, seed in spec.cells:
        j.append(spec.run_id, _gen("A", pid, seed, f"A-{pid}-{seed}"))
        j.append(spec.run_id, _gen("B", pid, seed, f"B-{pid}-{seed}"))
    st = j.load(spec.run_id)
    pairs = blind_pairs(st)
    assert len(pairs) == 16
    lefts = {p.left[0] for p in pairs}
    assert lefts == {"A", "B"}  # both layouts occur: the sides really are shuffled
    assert all("quality" not in p.left + p.right and "speed" not in p.left + p.right for p in pairs)
    for p in pairs:  # the grader always prefers the answer that came from A
        pick = "left" if p.left.startswith("A") else "right"
        g = grade_from_pick(st, p.prompt_id, p.seed, pick)
        assert g.diff == -1.0
        j.append(spec.run_id, g)
    st = j.load(spec.run_id)
    r = reveal(st)
    assert (r.summary.wins, r.summary.ties, r.summary.losses) == (0, 0, 16)
    assert r.summary.verdict == "too few seeds" or r.summary.seed_blocked.mean == -1.0
    s = grade_from_scores(st, "p1", 1, 7, 4)
    assert s.diff == (3.0 if not a_is_left(spec.run_id, "p1", 1) else -3.0)


def test_ab_run_switches_profiles_and_resumes_after_restart(make_controller, sim_settings) -> None:
    ctl = make_controller(extra_env=FAST_ENV)
    start_ready(ctl, "quality")
    svc = ABRunService(sim_settings, ctl)
    # 2 prompts x 1 seed: four whole answers (up to 420 tokens at the card's 48.9 / 83.2 tok/s); the cells' bookkeeping
    # over more seeds is test_journal_survives_a_torn_line_and_resumes_the_missing_cells's, the blind pairs' below
    spec = new_spec("quality", "speed", ["Implement a lock-free queue.", "Write a Raft leader election."],
                    [42], 600)
    svc.start(spec)
    deadline = time.monotonic() + 60
    while svc.progress().done < 1 and time.monotonic() < deadline:
        svc.wait(0.05)
    svc.cancel()  # the panel "stops" after at least one answer
    p = svc.wait(30)
    assert p.state is JobState.CANCELLED and "resume" in p.message
    kept = Journal(sim_settings.state_dir).load(spec.run_id).generated
    assert 1 <= kept < 4

    restarted = ABRunService(sim_settings, ctl)  # a fresh service, as after a panel restart
    restarted.resume(spec.run_id)
    p = restarted.wait(180)
    assert p.state is JobState.DONE, p.message
    # switched through the controller for B (B's answers are faster, below), then back to what it served before
    assert ctl.snapshot().profile_id == "quality" and ctl.snapshot().is_ready  # issue 49
    lines = [json.loads(x) for x in Journal(sim_settings.state_dir).path(spec.run_id).read_text().splitlines()]
    gens = [(x["side"], x["prompt_id"], x["seed"]) for x in lines if x["type"] == "gen"]
    assert len(gens) == 4 and len(set(gens)) == 4  # nothing generated twice
    st = Journal(sim_settings.state_dir).load(spec.run_id)
    a = [st.gens[("A", pid, s)].text for pid, s in spec.cells]
    b = [st.gens[("B", pid, s)].text for pid, s in spec.cells]
    assert a != b and all(g.finish == "stop" for g in st.gens.values())  # whole answers, profile-dependent
    r_a = [g.tok_s for g in st.gens.values() if g.side == "A" and g.tok_s]
    r_b = [g.tok_s for g in st.gens.values() if g.side == "B" and g.tok_s]
    assert max(r_a) < min(r_b)  # 48.9 vs 83.2 tok/s
