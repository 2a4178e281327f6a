"""A CLI switch drains the panel's answers, and meanwhile the panel's own snapshot says `draining` (drainnote.py),
so its gateway and Chat tab start no new answer on the engine about to stop; when the CLI's drain ends, the
panel's snapshot says so too. Real Docker, the SIMULATED engine, the CLI in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.backend.engine.lifecycle.answers import AnswersPublisher
from tests.polling import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.docker]
REPO = Path(__file__).resolve().parents[2]


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def answers_in_flight(self) -> int:
        return self.n


def test_the_panel_follows_a_cli_drain(make_controller, sim_settings, recipe_file, oplog_lines) -> None:
    panel = make_controller(resync_s=0.5)  # the panel's controller, watching Docker and the drain note
    t = panel.start("quality")
    assert t.wait(90) and t.ok, t.message
    wait_for(lambda: panel.busy() is None, 10, "the start operation over")
    answers = Counter()
    pub = AnswersPublisher(sim_settings.state_dir, [answers])  # the panel's gateway, streaming one answer
    pub.start()
    answers.n = 1
    env = {**os.environ, "MOET_SIM_BOOT_S": "1"}
    cli = subprocess.Popen([sys.executable, "-m", "app.cli.main", "engine", "switch", "--profile", "balanced",
                            "--recipe", str(recipe_file), "--data-dir", str(sim_settings.data_dir)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    try:
        wait_for(lambda: panel.snapshot().draining, 30, "the panel's snapshot says the CLI drains")
        snap = panel.snapshot()
        assert snap.is_ready and snap.profile_id == "quality" and snap.drain_in_flight == 1
        assert "action=drain_followed " in oplog_lines.getvalue()  # the operator's log says why (once)
        answers.n = 0  # the answer finished: the CLI's drain ends and it switches
        out, _ = cli.communicate(timeout=120)
        assert cli.returncode == 0, out
        wait_for(lambda: (s := panel.snapshot()).is_ready and s.profile_id == "balanced" and not s.draining, 60,
                 "the panel follows the switch, no longer draining")
        assert oplog_lines.getvalue().count("action=drain_followed ") == 1
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
        pub.close()
