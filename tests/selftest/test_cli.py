"""`moet-panel selftest` against a running SIMULATED engine (real Docker); it never starts one."""

from __future__ import annotations

import json

from app.backend.abtest.journal import Journal
from app.backend.chat.models import Conversation, Message
from app.backend.chat.store import ChatStore
from app.backend.config.settings import resolve_settings
from app.cli.main import main
from tests.selftest.conftest import FAST_ENV, recipe_file, start_ready


def test_selftest_cli_json_and_refusal(make_controller, sim_settings, tmp_path, capsys) -> None:
    path = recipe_file(tmp_path, sim_settings)
    settings = resolve_settings(path, sim_settings.data_dir)
    common = ["--recipe", str(path), "--data-dir", str(sim_settings.data_dir)]
    assert main(["selftest", *common, "--profile", "quality", "--runs", "1"]) == 1
    assert "start profile quality first" in capsys.readouterr().err
    start_ready(make_controller(settings=settings, extra_env=FAST_ENV))
    assert main(["selftest", *common, "--profile", "speed"]) == 1
    assert "switch to speed first" in capsys.readouterr().err
    assert main(["selftest", *common, "--profile", "quality", "--needle", "64kb"]) == 2
    assert "not a number of tokens" in capsys.readouterr().err
    assert main(["selftest", *common, "--profile", "quality", "--gpu", "3"]) == 2  # a one-GPU box has GPU 0 only
    assert "GPU 3 is not one of this box's (0)" in capsys.readouterr().err
    rc = main(["selftest", *common, "--profile", "quality", "--runs", "2", "--decode-tokens", "60",
               "--needle", "64k", "--ttft", "", "--json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    data = json.loads(out.out)
    assert data["profile_id"] == "quality" and len(data["decode"]) == 2
    assert data["summary"]["needles"] == ["64K: 3/3 depths (0.05 ✓, 0.5 ✓, 0.95 ✓)"]
    assert data["summary"]["card_line"].startswith("card 48.9 · SIMULATED box")
    assert "about" in out.err and "decode run 2/2" in out.err


def test_abtest_cli_run_grade_reveal(make_controller, sim_settings, tmp_path, capsys, monkeypatch) -> None:
    path = recipe_file(tmp_path, sim_settings)
    settings = resolve_settings(path, sim_settings.data_dir)
    common = ["--recipe", str(path), "--data-dir", str(sim_settings.data_dir)]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "Implement an SSA register allocator."}\n')
    store = ChatStore(settings.ensure_state_dir() / "chat.sqlite")  # one prompt comes from the chat history
    conv = Conversation(title="raft", system_prompt="You are a distributed-systems reviewer.",
                        messages=[Message("user", "Explain Raft joint consensus."), Message("assistant", "...")])
    store.create(conv)
    store.close()
    assert main(["abtest", *common, "run", "--a", "quality", "--b", "quality", "--prompts", str(prompts)]) == 2
    assert "two different profiles" in capsys.readouterr().err
    start_ready(make_controller(settings=settings, extra_env=FAST_ENV), "quality")
    # short answers (64 tokens, cut with finish `length`): the CLI's run, grading and reveal are the point here; whole
    # answers are test_abtest.py's and the Compare tab test's
    rc = main(["abtest", *common, "run", "--a", "quality", "--b", "speed", "--prompts", str(prompts),
               "--from-chat", f"{conv.id[:8]}:1", "--chat-context", "--seeds", "1,2", "--max-tokens", "64"])
    err = capsys.readouterr().err
    assert rc == 0, err
    run_id = err.split("A/B run ", 1)[1].split(":", 1)[0]
    spec = Journal(settings.state_dir).load(run_id).spec
    assert spec.prompts[1].source == f"chat {conv.id} turn 1"
    assert spec.prompts[1].messages()[0] == {"role": "system", "content": "You are a distributed-systems reviewer."}
    answers = iter(["x", "l", "r", "t", "l"])  # one bad key first: asked again
    monkeypatch.setattr("builtins.input", lambda _prompt="": next(answers))
    assert main(["abtest", *common, "grade", run_id]) == 0
    out = capsys.readouterr().out
    assert "--- LEFT ---" in out and "quality" not in out.replace("max quality", "")  # names hidden
    assert main(["abtest", *common, "reveal", run_id, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["graded"] == 4 and data["a"]["profile"] == "quality" and data["b"]["profile"] == "speed"
    assert data["summary"]["wins"] + data["summary"]["ties"] + data["summary"]["losses"] == 4
    assert data["b"]["median_tok_s"] > data["a"]["median_tok_s"]
    assert main(["abtest", *common, "list"]) == 0
    assert f"{run_id}  A=quality B=speed  8/8 answers, 4/4 graded" in capsys.readouterr().out
