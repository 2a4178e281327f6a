"""The restart policy (pure): exponential backoff, the cap inside a window, non-healing classes never retried."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.backend.engine.supervision.desired import DesiredStore
from app.backend.engine.supervision.restartpolicy import NON_HEALING, GiveUp, PolicyConfig, Restart, decide, parse_policy


def test_backoff_doubles_up_to_the_cap_then_gives_up() -> None:
    cfg = PolicyConfig()  # 3 tries in 15 min, 5 s base
    made: list[float] = []
    delays = []
    for now in (0.0, 60.0, 120.0):
        d = decide(cfg, "killed", made, now)
        assert isinstance(d, Restart)
        delays.append((d.try_no, d.of, d.delay_s))
        made.append(now)
    assert delays == [(1, 3, 5.0), (2, 3, 10.0), (3, 3, 20.0)]
    g = decide(cfg, "killed", made, 180.0)
    assert isinstance(g, GiveUp) and g.healing and g.why == "gave up after 3 tries in 15 min"
    assert isinstance(decide(cfg, "killed", made, 0.0 + 900.0 + 1), Restart)  # the first try left the window


@pytest.mark.parametrize("reason", sorted(NON_HEALING))
def test_non_healing_classes_are_never_retried(reason: str) -> None:
    d = decide(PolicyConfig(), reason, [], 0.0)
    assert isinstance(d, GiveUp) and not d.healing and d.why.startswith("not retried: ")


def test_policy_never_does_nothing_and_bad_values_are_refused() -> None:
    assert decide(PolicyConfig(policy="never"), "killed", [], 0.0) is None
    assert parse_policy(" On-Failure ") == "on-failure"
    with pytest.raises(ValueError, match="expected on-failure or never"):
        parse_policy("always")


def test_desired_state_is_written_whole_and_a_broken_file_means_unset(tmp_path: Path) -> None:
    store = DesiredStore(tmp_path / ".moet-panel")
    assert store.read() is None
    d = store.write("serve", "quality", "CLI")
    assert store.read() == d and d.key == "serve:quality"
    assert not list(store.path.parent.glob(".*.tmp"))  # the temp file was renamed, not left behind
    assert json.loads(store.path.read_text())["kind"] == "serve"
    assert store.write("stopped", "quality", "panel").key == "stopped" and store.read().profile_id is None
    store.path.write_text('{"kind": "serve"')  # torn by hand: never half an intent
    assert store.read() is None
