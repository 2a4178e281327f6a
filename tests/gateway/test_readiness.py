"""The gateway's view of the engine: the panel controller's snapshot, each state with a reason a client can act on."""

from __future__ import annotations

from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState
from app.backend.gateway.engine_status import SnapshotSource


def _status(**kw: object):
    snap = EngineSnapshot(**kw)  # type: ignore[arg-type]
    return SnapshotSource(lambda: snap, "http://127.0.0.1:8000").status()


def test_snapshot_states_map_to_ready_or_a_reason() -> None:
    ok = _status(state=EngineState.READY, base_url="http://127.0.0.1:8123", served_name="m")
    assert ok.ready and ok.base_url == "http://127.0.0.1:8123" and ok.reason == ""
    cases = {
        EngineState.STOPPED: "stopped; start it",
        EngineState.PREFLIGHT: "preflight",
        EngineState.STARTING: "starting (planes from cache 12/43)",
        EngineState.STOPPING: "switching profile",
        EngineState.STALLED: "stalled",
    }
    for state, words in cases.items():
        st = _status(state=state, phase="planes from cache 12/43")
        assert not st.ready and words in st.reason, (state, st.reason)
        assert st.base_url == "http://127.0.0.1:8000"  # the recipe's, when the snapshot has none
    failed = _status(state=EngineState.FAILED, diagnosis=Diagnosis("pool_not_loaded", "pool not loaded", "x", "y"))
    assert not failed.ready and "failed: pool not loaded" in failed.reason


def test_a_draining_snapshot_refuses_new_requests_with_the_expected_time_and_round_trips_the_pipe() -> None:
    from app.backend.gateway.engine_status import EngineStatus

    st = _status(state=EngineState.READY, base_url="http://127.0.0.1:8123", draining=True, expected_back_s=95.0)
    assert st.ready and st.draining and not st.accepts and st.retry_after_s == 95.0
    assert "about to stop or switch" in st.reason
    assert EngineStatus.from_line(st.to_line()) == st  # the panel → child pipe carries both fields
    booting = _status(state=EngineState.STARTING, expected_back_s=40.0)
    assert not booting.accepts and booting.retry_after_s == 40.0
    assert _status(state=EngineState.STOPPED).retry_after_s == 0.0  # not coming back by itself: no Retry-After
    # a line from an older panel (no drain fields) still reads; a silly retry is ignored
    old = EngineStatus.from_line(b'{"ready": true, "base_url": "http://x:1", "retry_after_s": -5}')
    assert old.accepts and old.retry_after_s == 0.0


def test_the_running_profiles_sequences_become_the_gateways_engine_slots() -> None:
    from pathlib import Path

    from app.backend.gateway.engine_status import EngineStatus
    from app.backend.gateway.proxy import DEFAULT_MAX_TOKENS
    from app.backend.gateway.server import engine_slots_of, limits_for_recipe
    from app.backend.recipe.loader import load_recipe

    root = Path(__file__).resolve().parents[2]
    card = load_recipe(root / "assets" / "recipes" / "ds4-flash-0731-sm120.toml")
    assert engine_slots_of(card, card.recommended_profile) == 1  # the card's single stream
    lim = limits_for_recipe(card)
    assert lim.engine_slots == 1 and lim.context_tokens == card.context.validated_max_tokens
    assert lim.max_tokens == DEFAULT_MAX_TOKENS < lim.context_tokens  # a shared box's cap, not the context (issue 48)
    snap = EngineSnapshot(state=EngineState.READY, base_url="http://127.0.0.1:8123", profile_id="two")
    asked: list[str] = []
    src = SnapshotSource(lambda: snap, "http://127.0.0.1:8000", slots_for=lambda pid: asked.append(pid) or 2)
    st = src.status()
    assert st.slots == 2 and EngineStatus.from_line(st.to_line()).slots == 2
    src.status()
    assert asked == ["two"]  # computed once per profile
