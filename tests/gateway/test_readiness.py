"""The gateway's view of the engine: the panel controller's snapshot, each state with a reason a client can act on."""

from __future__ import annotations

from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState
from app.backend.gateway.readiness import SnapshotSource


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
