"""The canary's schedule (pure): only when idle, start to start, the second try at once, stalled after two."""

from __future__ import annotations

from app.backend.engine.supervision.canary import CanaryResult, CanaryState, Load

IDLE = Load(running=0, waiting=0, generated=10, prompted=5)


def test_canary_waits_for_idle_and_the_interval() -> None:
    c = CanaryState(interval_s=30, timeout_s=10)
    c._proof_at = 0.0
    assert not c.due(IDLE, 29.0) and c.due(IDLE, 30.0)
    assert not c.due(Load(1, 0, 10, 5), 100.0)  # a request runs: its tokens are the proof
    assert not c.due(Load(0, 1, 10, 5), 100.0)  # one waits: a canary would make it wait longer
    assert c.seconds_until_due(10.0) == 20.0


def test_token_movement_is_proof_and_two_failures_stall() -> None:
    c = CanaryState(interval_s=30, timeout_s=10)
    c._proof_at = 0.0
    c.due(IDLE, 1.0)
    assert not c.due(Load(0, 0, 50, 5), 40.0)  # tokens moved since the last read: proof at 40 s
    assert not c.record(CanaryResult("failed", "timeout", 10), 80.0)
    assert c.due(IDLE, 80.5) and c.seconds_until_due(80.5) == float("inf")  # retry in the same pass only
    assert c.record(CanaryResult("failed", "timeout", 10), 81.0)
    assert c.status().startswith("failed 2 of 2")
    c.reset()
    assert c.failures == 0 and c.status().startswith("waiting")


def test_a_yielded_canary_is_neither_pass_nor_fail() -> None:
    c = CanaryState(interval_s=30, timeout_s=10)
    assert not c.record(CanaryResult("failed", "x", 1), 0.0)
    assert not c.record(CanaryResult("yielded", "yielded to a user request", 0.01), 1.0)
    assert c.failures == 1 and c.yielded == 1
    assert not CanaryState(0, 10).enabled and CanaryState(0, 10).status() == "off"


def test_the_canarys_own_token_is_not_taken_for_user_traffic() -> None:
    """The canary moves the token counters itself; the read after it must not postpone the next canary
    (that added up to one liveness poll to every interval, and to the time to detect a hang)."""
    c = CanaryState(interval_s=2, timeout_s=1)
    c._proof_at = 0.0
    assert c.due(IDLE, 2.0)
    assert not c.record(CanaryResult("ok", "0.01 s", 0.01), 2.0)
    assert not c.due(Load(0, 0, 11, 6), 3.0)  # the canary's own prompt and token moved the counters
    assert c.due(Load(0, 0, 11, 6), 4.0)  # due two seconds after it was sent, not two after that read
    assert not c.due(Load(0, 0, 40, 6), 5.0)  # a user's tokens after that are proof again
    assert not c.due(Load(0, 0, 40, 6), 6.9) and c.due(Load(0, 0, 40, 6), 7.0)


def test_a_new_runs_interval_counts_from_when_it_became_ready() -> None:
    """The liveness thread sees a new ready engine up to a poll later; the first canary is still due one
    interval after ready (the controller passes the READY state's time)."""
    c = CanaryState(interval_s=2, timeout_s=1)
    c.reset(proof_at=100.0)
    assert c.seconds_until_due(100.5) == 1.5
    assert c.due(IDLE, 102.0)
