"""A/B grading by score, the rubric, and prompts from chat history (unit: no engine, no Docker)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.backend.abtest.chat_prompts import history_of_store, pick_turns, user_turns
from app.backend.abtest.grading import a_is_left, ab_scores, grade_from_pick, grade_from_scores, reveal, reveal_json, reveal_markdown
from app.backend.abtest.journal import Generation, Journal, Prompt, RunState, new_spec
from app.backend.chat.models import Conversation, Message
from app.backend.chat.store import ChatStore, ChatStoreError
from app.backend.config.settings import Settings
from app.cli.main import main
from tests.selftest.conftest import recipe_file

# (prompt, seed) -> (score of A, score of B): the hand-computed example of test_score_reveal...
SCORES = {("p1", 1): (8, 6), ("p2", 1): (5, 6), ("p1", 2): (7, 7), ("p2", 2): (9, 5),
          ("p1", 3): (6, 7), ("p2", 3): (6, 4.5)}


def _generated_run(tmp_path: Path, seeds: list[int], rubric: str = "") -> tuple[Journal, RunState]:
    j = Journal(tmp_path)
    spec = new_spec("quality", "balanced", ["first", "second"], seeds, 256, rubric=rubric)
    j.create(spec)
    for pid, seed in spec.cells:
        for side in ("A", "B"):
            j.append(spec.run_id, Generation(side, pid, seed, f"{side}-{pid}-{seed}", 10, 50.0 if side == "A" else 70.0,
                                             0.2, "stop"))
    return j, j.load(spec.run_id)


def _score(j: Journal, st: RunState, pid: str, seed: int, a: float, b: float, note: str = "") -> None:
    """Grade as a blind grader would: the scores typed against the sides as shown."""
    left, right = (a, b) if a_is_left(st.spec.run_id, pid, seed) else (b, a)
    j.append(st.spec.run_id, grade_from_scores(st, pid, seed, left, right, note))


def test_score_reveal_matches_hand_computation(tmp_path: Path) -> None:
    j, st = _generated_run(tmp_path, [1, 2, 3])
    for (pid, seed), (a, b) in SCORES.items():
        _score(j, st, pid, seed, a, b)
    r = reveal(j.load(st.spec.run_id))
    assert r.scores is not None and r.scores.pairs == 6 and r.graded == 6
    # d = B - A per pair: seed 1: -2, +1 -> -0.5; seed 2: 0, -4 -> -2; seed 3: +1, -1.5 -> -0.25.
    # Seed means -0.5, -2, -0.25: mean -0.916667, sd sqrt(((0.416667)² + (1.083333)² + (0.666667)²) / 2)
    # = sqrt(1.791667 / 2) = 0.946485, SE 0.946485 / sqrt(3) = 0.546453, t(2, 0.95) = 2.919986
    # -> half width 1.595636 -> [-2.512302, 0.678969]: no decisive difference.
    p = r.scores.points
    assert p.seed_blocked.n == 3 and p.seed_blocked.mean == pytest.approx(-0.916667, abs=1e-6)
    assert p.seed_blocked.low == pytest.approx(-2.512302, abs=1e-5)
    assert p.seed_blocked.high == pytest.approx(0.678969, abs=1e-5)
    assert p.verdict == "no decisive difference"
    # pooled over the 6 pairs: squared deviations sum 19.208333, sd sqrt(19.208333 / 5) = 1.960017,
    # SE 0.800174, t(5) = 2.015048 -> half width 1.612388
    assert p.pooled.n == 6 and p.pooled.high == pytest.approx(-0.916667 + 1.612388, abs=1e-5)
    assert r.scores.mean_a == pytest.approx(41 / 6) and r.scores.mean_b == pytest.approx(35.5 / 6)
    # win/tie/loss by score for B: +1, +1 wins; 0 tie; -2, -4, -1.5 losses — and the preference the same
    assert (p.wins, p.ties, p.losses) == (2, 1, 3)
    assert (r.summary.wins, r.summary.ties, r.summary.losses) == (2, 1, 3)
    # the preference counts a scored pair by its sign: seed means 0, -0.5, 0
    assert r.summary.seed_blocked.mean == pytest.approx(-1 / 6)
    assert "points (0–10) seed-blocked" in r.headline() and "−0.92" in r.headline().replace("-", "−")
    md = reveal_markdown(r)
    assert "## Scores (0–10), 6 scored pairs" in md and "A (quality) 6.83, B (balanced) 5.92" in md
    assert "[-2.51, +0.68]" in md
    data = json.loads(reveal_json(r))
    assert data["scores"]["points"]["seed_blocked"]["low"] == pytest.approx(-2.512302, abs=1e-5)
    assert data["headline"] == r.headline()


def test_mixed_picks_and_scores_keep_the_units_apart(tmp_path: Path) -> None:
    j, st = _generated_run(tmp_path, [1, 2])
    _score(j, st, "p1", 1, 9, 3)  # B - A = -6 points
    pick_a = "left" if a_is_left(st.spec.run_id, "p2", 1) else "right"
    j.append(st.spec.run_id, grade_from_pick(st, "p2", 1, pick_a))
    r = reveal(j.load(st.spec.run_id))
    assert r.scores is not None and r.scores.pairs == 1 and r.scores.points.seed_blocked.mean == -6.0
    assert r.summary.seed_blocked.mean == -1.0  # the preference is -1 for both, not (-6 + -1) / 2
    assert "points" not in r.headline()  # not every pair is scored: the preference leads
    st2 = j.load(st.spec.run_id)
    g = st2.grades[("p1", 1)]
    assert ab_scores(st2, g) == (9.0, 3.0) and ab_scores(st2, st2.grades[("p2", 1)]) is None
    with pytest.raises(ValueError, match="scores are 0–10, got 11"):
        grade_from_scores(st2, "p1", 2, 11, 5)


def test_rubric_and_scores_are_journalled_and_survive_a_restart(tmp_path: Path) -> None:
    j, st = _generated_run(tmp_path, [1, 2], rubric="10 = correct and complete")
    assert st.rubric == "10 = correct and complete"
    j.set_rubric(st.spec.run_id, "10 = compiles and passes the tests; 0 = wrong")
    _score(j, st, "p1", 1, 4, 8, note="B handles the empty queue")
    with open(j.path(st.spec.run_id), "a") as fh:
        fh.write('{"type": "grade", "prompt_id": "p2", "se')  # the panel died mid-write
    again = Journal(tmp_path).load(st.spec.run_id)  # as after a panel restart
    assert again.rubric == "10 = compiles and passes the tests; 0 = wrong"
    g = again.grades[("p1", 1)]
    assert g.diff == 4.0 and g.note == "B handles the empty queue" and ab_scores(again, g) == (4.0, 8.0)
    assert len(again.grades) == 1
    r = reveal(again)
    assert r.rubric.startswith("10 = compiles") and "rubric: 10 = compiles" in reveal_markdown(r)
    with pytest.raises(KeyError):
        j.set_rubric("20990101T000000-abcdef", "x")


def test_a_journal_from_before_scores_and_chat_prompts_still_loads(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.root.mkdir(parents=True)
    header = {"type": "header", "run_id": "20261130T120000-abcdef", "profile_a": "quality", "profile_b": "speed",
              "prompts": [{"id": "p1", "text": "old"}], "seeds": [1], "max_tokens": 64, "created": "2026-11-30T12:00:00"}
    j.path("20261130T120000-abcdef").write_text(json.dumps(header) + "\n")
    st = j.load("20261130T120000-abcdef")
    assert st.spec.prompts == (Prompt("p1", "old"),) and st.rubric == "" and st.spec.rubric == ""


def _conversation(store: ChatStore, title: str, system: str, turns: list[tuple[str, str]]) -> Conversation:
    msgs: list[Message] = []
    for user, answer in turns:
        msgs.append(Message("user", user))
        if answer:
            msgs.append(Message("assistant", answer))
    conv = Conversation(title=title, system_prompt=system, messages=msgs)
    store.create(conv)
    return conv


def test_chat_turns_are_picked_with_or_without_their_context(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chat.sqlite")
    queue = _conversation(store, "lock-free queue", "You are terse.",
                          [("Implement a lock-free MPMC queue.", "Here is one..."), ("Now make it bounded.", "Done.")])
    raft = _conversation(store, "raft", "", [("Explain Raft joint consensus.", "")])
    history = history_of_store(store)
    turns = user_turns(store.load(queue.id) or queue)
    assert [t.turn for t in turns] == [1, 2] and turns[0].context == (("system", "You are terse."),)
    assert turns[1].context == (("system", "You are terse."), ("user", "Implement a lock-free MPMC queue."),
                                ("assistant", "Here is one..."))
    assert turns[1].label().startswith("lock-free queue · turn 2 (+3 earlier): Now make it bounded.")
    picked = pick_turns(history, [f"{queue.id[:6]}:2", raft.id])
    assert [t.key for t in picked] == [f"{queue.id}:2", f"{raft.id}:1"]
    with_ctx = picked[0].to_prompt(True)
    assert with_ctx.messages()[-1] == {"role": "user", "content": "Now make it bounded."} and len(with_ctx.messages()) == 4
    assert picked[0].to_prompt(False).messages() == [{"role": "user", "content": "Now make it bounded."}]
    assert with_ctx.source == f"chat {queue.id} turn 2"
    # into a run: numbered in order, the same turn picked twice is one prompt, and the journal keeps the context
    spec = new_spec("quality", "speed", [with_ctx, "pasted one", picked[1].to_prompt(True), with_ctx], [1], 64)
    assert [(p.id, p.text) for p in spec.prompts] == [("p1", "Now make it bounded."), ("p2", "pasted one"),
                                                      ("p3", "Explain Raft joint consensus.")]
    j = Journal(tmp_path)
    j.create(spec)
    assert j.load(spec.run_id).spec == spec
    for bad, msg in (("ab", "at least 4 characters"), ("zzzzzz", "no conversation"), (f"{queue.id}:3", "turns 1..2, not 3"),
                     (f"{queue.id}:x", "turn numbers")):
        with pytest.raises(ValueError, match=msg):
            pick_turns(history, [bad])
    store.close()


def test_read_only_store_leaves_a_live_reply_alone(tmp_path: Path) -> None:
    path = tmp_path / "chat.sqlite"
    with pytest.raises(ChatStoreError, match="no chat history"):
        ChatStore(path, read_only=True)
    panel = ChatStore(path)
    conv = _conversation(panel, "live", "", [("hello", "")])
    reply = Message("assistant", "partial", status="streaming")
    panel.add_message(conv, reply)
    reader = ChatStore(path, read_only=True)  # the CLI beside a running panel
    assert [t.text for t in pick_turns(history_of_store(reader), [conv.id])] == ["hello"]
    loaded = panel.load(conv.id)
    assert loaded is not None and loaded.messages[-1].status == "streaming"  # not "recovered" by the reader
    with pytest.raises(ChatStoreError, match="readonly"):
        reader.delete(conv.id)
    reader.close()
    panel.close()


def test_cli_chat_prompts_rubric_score_grading_and_reveal(sim_settings: Settings, tmp_path: Path, capsys: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI without an engine: pick turns from the chat history, journal a rubric, grade by score, reveal."""
    common = ["--recipe", str(recipe_file(tmp_path, sim_settings)), "--data-dir", str(sim_settings.data_dir)]
    state_dir = sim_settings.ensure_state_dir()
    assert main(["abtest", *common, "chat-prompts"]) == 2
    assert "no chat history" in capsys.readouterr().err
    store = ChatStore(state_dir / "chat.sqlite")
    conv = _conversation(store, "queues", "", [("Implement a lock-free MPMC queue.", "ok"), ("Make it bounded.", "")])
    store.close()
    assert main(["abtest", *common, "chat-prompts"]) == 0
    out = capsys.readouterr().out
    assert f"{conv.id}  queues" in out and f"--from-chat {conv.id[:8]}:2   Make it bounded." in out
    assert main(["abtest", *common, "run", "--a", "quality", "--b", "speed"]) == 2
    assert "give --prompts FILE.jsonl and/or --from-chat" in capsys.readouterr().err
    assert main(["abtest", *common, "run", "--a", "quality", "--b", "speed", "--from-chat", f"{conv.id}:5"]) == 2
    assert "has user turns 1..2, not 5" in capsys.readouterr().err

    j, st = _generated_run(state_dir, [1, 2])
    rid = st.spec.run_id
    assert main(["abtest", *common, "rubric", rid, "10 = correct, complete, idiomatic"]) == 0
    answers = iter(["11", "7", "4", "x", "6", "6", "q"])  # out of range and not a number: asked again
    monkeypatch.setattr("builtins.input", lambda _prompt="": next(answers))
    assert main(["abtest", *common, "grade", rid, "--scores"]) == 0
    out = capsys.readouterr().out
    assert "rubric: 10 = correct, complete, idiomatic" in out and "--- LEFT ---" in out
    graded = j.load(rid)
    assert len(graded.grades) == 2 and {(g.left, g.right) for g in graded.grades.values()} == {(7.0, 4.0), (6.0, 6.0)}
    assert main(["abtest", *common, "reveal", rid, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["scores"]["pairs"] == 2 and data["rubric"] == "10 = correct, complete, idiomatic"
    assert data["graded"] == 2 and data["summary"]["ties"] == 1
    assert main(["abtest", *common, "reveal", "20990101T000000-abcdef"]) == 2
    assert "no A/B run '20990101T000000-abcdef'" in capsys.readouterr().err
