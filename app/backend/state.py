"""The one explicit application-state object: settings plus the backend services.

The UI receives an `AppState` and calls its services; nothing else holds mutable state globally.
Services are created by `build_app_state()` and started/stopped together. A test may build an
`AppState` with only the services its tab needs; a tab shows why when its service is absent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.backend import oplog
from app.backend.prometheus.counters import PanelCounters
from app.backend.profiles.registry import ProfileRegistry
from app.backend.config.settings import Settings

if TYPE_CHECKING:  # types only: the service packages import settings, never this module
    from app.backend.abtest.runner import ABRunService
    from app.backend.chat.conversations import ChatService
    from app.backend.download.manager import DownloadManager
    from app.backend.engine.controller import EngineController
    from app.backend.engine.gpus import BoxGpus
    from app.backend.fleet.service import FleetFront
    from app.backend.gateway.switch import GatewayService
    from app.backend.selftest.runner import SelfTestService
    from app.backend.alerts.delivery import AlertService
    from app.backend.alerts.notify import Notifier
    from app.backend.contracts import GpuReader
    from app.backend.telemetry.sampler import TelemetrySampler
    from app.backend.telemetry.nvml import NvmlGpuReader
    from app.backend.engine.lifecycle.tickets import ControllerOptions
    from app.backend.recipe.schema import ProfileSpec


@dataclass
class AppState:
    settings: Settings
    engine: EngineController | None = None  # GPU 0's engine (the box's only one on a one-GPU box)
    box: BoxGpus | None = None  # every GPU's engine, one controller each (docs/engine.md "Several GPUs")
    downloads: DownloadManager | None = None
    telemetry: TelemetrySampler | None = None
    chat: ChatService | None = None
    selftest: SelfTestService | None = None
    abtest: ABRunService | None = None
    gateway: GatewayService | None = None  # the API gateway (off until switched on; docs/gateway.md)
    front: FleetFront | None = None  # a fleet's front: the router and the fleet's view (docs/fleet.md); else None
    gpu: GpuReader | None = None  # the one GPU reader, shared by the engine and telemetry
    notifier: Notifier | None = None  # alerts to a person (Apprise), docs/engine.md "Telling a person"
    alerting: AlertService | None = None
    counters: PanelCounters = field(default_factory=PanelCounters)  # for /metrics (docs/metrics.md)
    # the one listing of servable profiles (recipe + custom), built beside the settings (not inside them)
    profiles: ProfileRegistry = field(default=None)  # type: ignore[assignment]
    _closers: list[Callable[[], object]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.profiles is None:
            self.profiles = ProfileRegistry(self.settings)

    def on_close(self, fn: Callable[[], object]) -> None:
        self._closers.append(fn)

    def close(self) -> None:
        """Stop background threads. Never stops the engine container (it outlives the panel)."""
        for fn in reversed(self._closers):
            try:
                fn()
            except Exception as exc:  # closing must not mask the others
                oplog.caught("panel", exc, f"closing {getattr(fn, '__qualname__', fn)}", traceback=True)
        self._closers.clear()


def build_app_state(settings: Settings, nvml_reader: NvmlGpuReader | None = None) -> AppState:
    """Create every backend service for this settings object. `nvml_reader`: the NVML reader `serve`'s host
    probe already opened, kept as the process's one GPU reader."""
    from app.backend.abtest.runner import ABRunService
    from app.backend.chat.conversations import ChatService
    from app.backend.download.manager import DownloadManager
    from app.backend.engine.lifecycle.tickets import ControllerOptions
    from app.backend.selftest.drift import DriftWatch, baseline_from
    from app.backend.selftest.runner import SelfTestService
    from app.backend.telemetry.gpu import box_gpu_count, follow_engine, make_gpu_reader
    from app.backend.telemetry.sampler import TelemetrySampler

    state = AppState(settings=settings)
    # Downloads stay idle until started; in demo mode a SIMULATED local hub starts on first use. The
    # closer pauses a running download (verified data is kept).
    downloads = state.downloads = DownloadManager(settings)
    state.on_close(downloads.close)

    # The engine picks Docker (or the SIMULATED process runtime) and reattaches to a running panel engine;
    # its closer stops the panel's threads, never the engine container. One GPU reader for the whole app
    # (engine preflight and release wait, telemetry): made here, injected into both.
    state.gpu = make_gpu_reader(settings, nvml_reader=nvml_reader)
    # One engine per GPU of the box (docs/engine.md "Several GPUs"); a one-GPU box: the one engine, as before.
    # `engine` is GPU 0's: the tabs that show one engine (chat, self-test, telemetry) follow it.
    box = state.box = make_box_gpus(settings, state.gpu, box_gpu_count(state.gpu), lambda gpu: ControllerOptions(),
                                     profiles_fn=state.profiles.list, supervise=True)
    state.on_close(box.close)
    engine = state.engine = box.controller(box.gpus[0])
    sim_card = follow_engine(state.gpu, engine)  # demo mode: the SIMULATED card follows this engine
    for g in box.gpus[1:]:
        follow_engine(state.gpu, box.controller(g), g)

    # The chat and the telemetry hub follow the engine's change events: each makes its one watch here (through
    # `engine=`) and closes it with itself (docs/engine.md, "Who listens").
    chat = state.chat = ChatService(settings.recipe, settings.ensure_state_dir(), engine=engine)
    engine.add_answer_counter(chat)  # a stop/switch lets the Chat tab's answers finish (docs/engine.md "Keeps serving")
    state.on_close(chat.close)

    # a box of several GPUs: the hub scrapes every GPU's engine too, for the per-GPU figures and plots
    telemetry = state.telemetry = TelemetrySampler(settings, engine=engine, gpu_reader=state.gpu, sim_card=sim_card,
                                               more_engines={g: box.controller(g).snapshot for g in box.gpus[1:]},
                                               gpu=box.gpus[0])
    telemetry.start()
    state.on_close(telemetry.close)

    # The self-test measures the serving profile; it never starts or stops the engine.
    # A box of several GPUs: GPU 0 (which the self-test measures) is left out of the gateway while it runs; the
    # other GPUs keep serving (docs/engine.md "Several GPUs").
    multi = len(box.gpus) > 1
    gpu0 = box.gpus[0]

    from app.backend.gateway.leftout import LeftOutNotes

    left_notes = LeftOutNotes(settings.ensure_state_dir())
    state.on_close(left_notes.close)

    def leave_out(on: bool, gpus: list[int], why: str) -> None:
        """A measure on these GPUs: the gateway sends them nothing meanwhile — the panel's (told at once) and a
        `moet-panel gateway` beside it (gateway/leftout.py)."""
        box.leave_out(gpus, why) if on else box.take_back(gpus)
        left_notes.publish(box.left_out())
        if state.gateway is not None:
            state.gateway.push()

    def measuring(on: bool, gpu: int | None) -> None:
        if gpu is not None:
            leave_out(on, [gpu], "self-test")

    selftest = state.selftest = SelfTestService(
        settings, engine, frame_fn=telemetry.latest, on_run=measuring if multi else None, gpu=gpu0 if multi else None,
        engines={g: box.controller(g) for g in box.gpus} if multi else None)
    telemetry.drift = DriftWatch(baseline_from(selftest.store, engine.profiles))
    state.on_close(selftest.cancel)
    # a box of several GPUs: a run may put A and B side by side on two GPUs (left out of the gateway meanwhile)
    abtest = state.abtest = ABRunService(
        settings, engine, engines={g: box.controller(g) for g in box.gpus} if multi else None,
        on_gpus=(lambda on, gpus: leave_out(on, list(gpus), "blind A/B")) if multi else None)
    state.on_close(abtest.cancel)  # finished answers stay journalled; resume continues

    # The API gateway: a process of its own, fed the engine's status on every change event; off until the
    # Access tab's switch, or started again here when the switch was left on (docs/gateway.md).
    from app.backend.engine.runtime.client import base_url
    from app.backend.gateway.server import config_from_env, engine_slots_of
    from app.backend.gateway.switch import GatewayService

    slots_for = lambda pid: engine_slots_of(settings.recipe, state.profiles.find(pid))  # noqa: E731
    from app.backend.gateway.routing import BoxSource, box_source

    # the gateway spreads over every GPU's engine (docs/gateway.md "Several GPUs: routing"); the same source as
    # `moet-panel gateway` builds for itself (docs/gateway.md "One gateway")
    source = box_source(box.gpus, lambda g: box.controller(g).snapshot,
                        lambda g: base_url(settings.recipe, settings.data_dir, g), slots_for, box.left_out)
    spread = source if isinstance(source, BoxSource) else None
    gateway = state.gateway = GatewayService(settings.ensure_state_dir(), config_from_env(recipe=settings.recipe), engine.snapshot,
                                             base_url(settings.recipe, settings.data_dir), subscribe=engine.on_change,
                                             slots_for=slots_for, source=source,
                                             subscribe_more=tuple(box.controller(g).on_change for g in box.gpus[1:]))
    chat.take_turns_through(gateway)  # the Chat tab's replies take their turn in its fair queue (docs/chat.md)
    if spread is None:
        engine.add_answer_counter(gateway)  # its answers in flight finish before a stop/switch (docs/engine.md "Keeps serving")
    else:
        for g in box.gpus:  # each GPU's drain waits for the gateway's answers on that GPU
            box.controller(g).add_answer_counter(_GpuAnswers(gateway, g))
    # the same answers, for a stop or switch another process makes (a CLI switch drains them too)
    from app.backend.engine.lifecycle.answers import AnswersPublisher

    # a box of several: per GPU too, so a CLI's rolling switch drains each GPU for its own answers only (the
    # Chat tab's answers are GPU 0's engine's)
    by_gpu = (lambda: {g: gateway.answers_in_flight_on(g) + (chat.answers_in_flight() if g == gpu0 else 0)
                       for g in box.gpus}) if spread is not None else None
    # ... and which GPUs its gateway sends to, so another process's rolling switch waits for it to see one (answers.py)
    # (none while its gateway is off: nothing of this panel would be refused)
    serving = (lambda: [e.gpu for e in spread.status().engines if e.accepts] if gateway.pid is not None else []
               ) if spread is not None else None
    publisher = AnswersPublisher(settings.ensure_state_dir(), [chat, gateway], by_gpu, serving)
    publisher.start()
    state.on_close(publisher.close)
    state.on_close(gateway.close)
    gateway.restore()
    # A fleet's front (a fleet file in the state dir, docs/fleet.md): vLLM's router, supervised; none otherwise
    from app.backend.fleet.service import start_front

    state.front = start_front(settings.ensure_state_dir())
    if state.front is not None:
        state.on_close(state.front.close)
    # Alerts to a person: woken by the engine's change events, sent on the notifier's own thread.
    from app.backend.alerts.delivery import AlertService
    from app.backend.service.config import ServiceConfigStore, effective_notify_urls
    from app.backend.alerts.notify import Notifier

    store = ServiceConfigStore(settings.state_dir)
    notifier = state.notifier = Notifier(lambda: effective_notify_urls(store)[0])
    state.on_close(notifier.close)
    alerting = state.alerting = AlertService(notifier, engine=engine, telemetry=telemetry, downloads=downloads,
                                             data_dir=settings.data_dir)
    state.on_close(alerting.close)
    return state


class _GpuAnswers:
    """The gateway's answers on one GPU's engine, as that engine's drain counts them (contracts.AnswerCounter)."""

    def __init__(self, gateway: GatewayService, gpu: int) -> None:
        self._gateway, self._gpu = gateway, gpu

    def answers_in_flight(self) -> int:
        return self._gateway.answers_in_flight_on(self._gpu)


# -- the engines: one controller per GPU of the box, wired to the services above the engine ----------------
# (the engine imports nothing drawn above it: the restart policy and drain grace of the Service settings, the
# profile registry and the download journals reach it here, as callables; docs/architecture.md)

def artifact_status_fn(settings: Settings) -> Callable[[str], str | None]:
    """Preflight's artifact item reads the download journals (docs/engine.md, "Preflight")."""
    from app.backend.download.journal import artifact_status

    return lambda art_id: artifact_status(settings.data_dir, art_id)


def make_engine_controller(settings: Settings, gpu_reader: GpuReader,
                           options: ControllerOptions | None = None,
                           profiles_fn: Callable[[], list[ProfileSpec]] | None = None, *,
                           supervise: bool = False) -> EngineController:
    """The controller with its collaborators. `gpu_reader`: the app's one reader (the callers make it with
    `telemetry.gpu.make_gpu_reader` and, once the controller exists, let a SIMULATED card follow it with
    `telemetry.gpu.follow_engine`: the engine never builds a reader).
    `supervise`: the panel's controller brings back what should run and restarts crashes (docs/engine.md)."""
    from app.backend.engine.lifecycle.answers import OtherProcessAnswers
    from app.backend.engine.controller import EngineController
    from app.backend.engine.runtime.choice import ensure_sim_image, select_runtime
    from app.backend.engine.builds.image import image_build_running
    from app.backend.engine.lifecycle.tickets import ControllerOptions
    from app.backend.service.config import ServiceConfigStore, effective_policy

    options = options or ControllerOptions()
    store = ServiceConfigStore(settings.state_dir)
    options.restart_policy_fn = lambda: effective_policy(store, settings.recipe.engine.restart)[0]
    options.drain_grace_fn = options.drain_grace_fn or (lambda: store.read().drain_grace_s)
    options.image_building_fn = options.image_building_fn or (lambda: image_build_running(settings.state_dir))
    options.supervise = options.supervise or supervise
    ctl = EngineController(
        settings,
        runtime_factory=lambda: select_runtime(settings),
        gpu_reader=gpu_reader,
        profiles_fn=profiles_fn or ProfileRegistry(settings).list,  # recipe + custom, re-read when saved
        options=options,
        ensure_image=ensure_sim_image,
        artifact_status=artifact_status_fn(settings),
    )
    # answers another process on this data dir streams (the panel's, for a CLI switch): drained too
    # answers other processes on this data dir stream on this GPU (the panel's or a standalone gateway's, for a
    # CLI switch): drained too
    ctl.add_answer_counter(OtherProcessAnswers(settings.state_dir, options.gpu))
    return ctl


def make_box_gpus(settings: Settings, gpu_reader: GpuReader, gpu_count: int,
               options_fn: Callable[[int | None], ControllerOptions],
               profiles_fn: Callable[[], list[ProfileSpec]] | None = None, *, supervise: bool = False) -> BoxGpus:
    """One controller per GPU of the box (docs/engine.md "Several GPUs"): `gpu_count` engines for a recipe that
    serves on a GPU (or the SIMULATED box), else the recipe's one engine. `options_fn(gpu)` gives each its
    options (gpu None: the one-GPU box, built exactly as before)."""
    from app.backend.engine.gpus import build_box_gpus

    needs_gpu = settings.recipe.simulated or settings.recipe.requirements.gpu_count > 0
    count = gpu_count if needs_gpu else 1

    def make(gpu: int | None) -> EngineController:
        opts = options_fn(gpu)
        opts.gpu = gpu
        opts.box_engines = count
        return make_engine_controller(settings, gpu_reader, opts, profiles_fn, supervise=supervise)

    from app.backend.engine.lifecycle.answers import OtherPublishers

    # a rolling switch waits for the other processes' gateways to see the GPU it booted (answers.py)
    return build_box_gpus(count, make, OtherPublishers(settings.ensure_state_dir()).serving)
