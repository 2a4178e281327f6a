"""The one explicit application-state object: settings plus the backend services.

The UI receives an `AppState` and calls its services; nothing else holds mutable state globally.
Services are created by `build_app_state()` and started/stopped together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.backend.settings import Settings

if TYPE_CHECKING:
    from app.backend.telemetry.nvml import NvmlGpuReader


@dataclass
class AppState:
    settings: Settings
    # Each service is owned by its backend package; typed loosely here to keep imports one-way.
    engine: Any = None  # app.backend.engine.controller.EngineController
    downloads: Any = None  # app.backend.download.manager.DownloadManager
    telemetry: Any = None  # app.backend.telemetry.hub.TelemetryHub
    chat: Any = None  # app.backend.chat.service.ChatService
    selftest: Any = None  # app.backend.selftest.runner.SelfTestService
    abtest: Any = None  # app.backend.abtest.runner.ABRunService
    gpu: Any = None  # app.backend.telemetry.gpu_types.GpuReader: the one reader, shared by engine and telemetry
    _closers: list[Any] = field(default_factory=list, repr=False)

    def on_close(self, fn: Any) -> None:
        self._closers.append(fn)

    def close(self) -> None:
        """Stop background threads. Never stops the engine container (it outlives the panel)."""
        for fn in reversed(self._closers):
            try:
                fn()
            except Exception:  # closing must not mask the others
                pass
        self._closers.clear()


def build_app_state(settings: Settings, nvml_reader: "NvmlGpuReader | None" = None) -> AppState:
    """Create every backend service for this settings object. `nvml_reader`: the NVML reader `serve`'s host
    probe already opened, kept as the process's one GPU reader."""
    state = AppState(settings=settings)
    # Services register themselves here as they land (downloads, engine, telemetry, chat).

    # downloads (owner: download helper): idle until started; in demo mode a SIMULATED local hub
    # is started on first use. The closer pauses a running download (verified data is kept).
    from app.backend.download.manager import DownloadManager

    state.downloads = DownloadManager(settings)
    state.on_close(state.downloads.close)

    # engine (owner: engine helper): picks Docker (or the SIMULATED process runtime), reattaches to a
    # running panel engine; its closer stops the panel's threads, never the engine container.
    # One GPU reader for the whole app (engine preflight/release wait, telemetry): made here, injected.
    from app.backend.engine.factory import default_gpu_reader, make_engine_controller

    ref: list[Any] = []
    state.gpu = default_gpu_reader(settings, ref, nvml_reader=nvml_reader)
    state.engine = make_engine_controller(settings, gpu_reader=state.gpu, ref=ref)
    state.on_close(state.engine.close)

    # chat (owner: chat helper). The snapshot is read lazily: the engine controller may be added after.
    from app.backend.chat.service import ChatService

    state.chat = ChatService(
        settings.recipe,
        settings.ensure_state_dir(),
        snapshot_fn=lambda: state.engine.snapshot() if state.engine is not None else None,
    )
    state.on_close(state.chat.close)

    # telemetry (owner: telemetry helper): one sampler thread; the engine is attached lazily
    # (here or on the first tick after state.engine is set).
    from app.backend.telemetry.hub import TelemetryHub

    state.telemetry = TelemetryHub(settings, engine=state.engine, gpu_reader=state.gpu, engine_provider=lambda: state.engine)
    state.telemetry.start()
    state.on_close(state.telemetry.close)

    # self-test: measures the serving profile; never starts/stops the engine.
    from app.backend.selftest.runner import SelfTestService

    state.selftest = SelfTestService(settings, state.engine, frame_fn=state.telemetry.latest)
    from app.backend.selftest.drift import DriftWatch, baseline_from

    state.telemetry.drift = DriftWatch(baseline_from(state.selftest.store, state.engine.profiles))
    state.on_close(state.selftest.cancel)
    from app.backend.abtest.runner import ABRunService

    state.abtest = ABRunService(settings, state.engine)
    state.on_close(state.abtest.cancel)  # finished answers stay journalled; resume continues
    return state
