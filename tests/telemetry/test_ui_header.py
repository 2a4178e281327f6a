"""Header strip formatting (no browser): engine state, VRAM bar + SIMULATED tag, decode, coverage, alerts."""

from __future__ import annotations

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.config.settings import resolve_settings
from app.backend.state import AppState
from app.backend.alerts.rules import Alert
from app.backend.telemetry.gpu_sim import sample_from_dict
from app.backend.telemetry.sampler import TelemetryFrame
from app.backend.telemetry.metrics import MetricsSample
from app.backend.telemetry.trace import parse_text
from app.ui.header import header_html

from .conftest import log_text


def _state(tmp_path) -> AppState:
    return AppState(settings=resolve_settings(SIMULATED_RECIPE, tmp_path, demo=True))


def test_header_ready_simulated(tmp_path) -> None:
    gpu = sample_from_dict({"memory_total_gib": 96, "memory_used_gib": 93.8, "memory_reserved_gib": 0.45,  # nvidia-smi: 93.8
                            "simulated": True, "name": "RTX PRO 6000 (SIMULATED)"})
    frame = TelemetryFrame(ts=1.0, gpus=(gpu,), gpu_simulated=True,
                           trace=parse_text(log_text("freq_trace1_every64_469slots_top8.log")).snapshot(),
                           metrics=MetricsSample(ts=1.0, decode_tok_s=48.9))
    html = header_html(_state(tmp_path), EngineSnapshot(state=EngineState.READY, profile_id="quality", simulated=True), frame)
    assert 'data-state="ready"' in html and "#1 max quality" in html and "Engine (SIMULATED)" in html
    assert 'data-vram-used="93.8"' in html and ">SIMULATED<" in html and "93.8 / 96.0 GiB" in html
    assert 'data-decode="48.9"' in html and 'data-coverage="46.5"' in html and 'data-alerts="0"' in html


def test_header_no_gpu_pool_absent_and_alerts(tmp_path) -> None:
    alerts = (Alert("pool_absent", "critical", "FP4 recovery pool absent (0 slots)", "m", "a"),)
    frame = TelemetryFrame(ts=1.0, gpu_error="no NVIDIA GPU (libnvidia-ml.so not found)",
                           trace=parse_text(log_text("disabled_auto_0slots_trace1_every64.log")).snapshot(), alerts=alerts)
    html = header_html(_state(tmp_path), EngineSnapshot(state=EngineState.STOPPED), frame)
    assert "no NVIDIA GPU (libnvidia-ml.so not found)" in html and 'data-vram="na"' in html
    assert 'data-coverage="0"' in html and "pool absent" in html
    assert 'data-alerts="1"' in html and "critical" in html and "no profile" in html
    assert 'data-decode="—"' in html


def test_header_before_first_sample(tmp_path) -> None:
    html = header_html(_state(tmp_path), None, TelemetryFrame())
    assert "sampling…" in html and 'data-coverage="—"' in html and 'data-state="stopped"' in html


def test_header_and_telemetry_say_a_pool_trace_not_understood(tmp_path) -> None:
    """Issue 45: a build whose pool lines cannot be read says so; never a blank or a number guessed."""
    from pathlib import Path

    from app.ui.telemetry import details_html

    text = (Path(__file__).parent / "fixtures" / "engine-logs-main" / "future_unknown_forms.log").read_text()
    frame = TelemetryFrame(ts=1.0, trace=parse_text(text).snapshot())
    html = header_html(_state(tmp_path), EngineSnapshot(state=EngineState.READY), frame)
    assert 'data-coverage="?"' in html and "this build's pool trace is not understood" in html
    assert "pool trace is not understood" in details_html(frame) and "tier v3" in details_html(frame)


def test_header_shows_every_gpu_on_a_box_of_several(tmp_path) -> None:
    from typing import cast

    from app.backend.engine.controller import EngineController
    from app.backend.engine.gpus import BoxGpus

    class Ctl:
        def __init__(self, snap: EngineSnapshot) -> None:
            self.snap = snap

        def snapshot(self) -> EngineSnapshot:
            return self.snap

    state = _state(tmp_path)
    frame = TelemetryFrame(ts=1.0, gpus=tuple(sample_from_dict({"memory_total_gib": 96, "memory_used_gib": u}, i)
                                              for i, u in enumerate((93.8, 0.0))))
    assert 'data-testid="hdr-gpus"' not in header_html(state, None, frame)  # one GPU: as before
    state.box = BoxGpus({0: cast(EngineController, Ctl(EngineSnapshot(state=EngineState.READY, profile_id="quality"))),
                         1: cast(EngineController, Ctl(EngineSnapshot(state=EngineState.STARTING)))})
    html = header_html(state, None, frame)
    assert 'data-gpu="0" data-state="ready"' in html and "quality · 93.8/96 GiB" in html
    assert 'data-gpu="1" data-state="starting"' in html and "0.0/96 GiB" in html
