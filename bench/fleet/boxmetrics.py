"""A namespaced box's panel `/metrics` (bench/fleet/simbox.py `--metrics-port`): what a real box's panel serves to the
fleet's Prometheus (docs/fleet.md#one-dashboard), without Gradio's page.

The real parts, as the panel wires them (app/backend/state.py, app/ui/app.py `launch`): an `AppState` holding the
box's engine controller, its GPU reader, the telemetry hub (its 1 s sampler: GPU, host, the engine's /metrics and
pool trace), the download manager (idle) and the panel's counters; the collector (`PanelCollector`) behind
`MetricsRoute` with a bearer token from a 0600 file (`load_token`, as `--metrics-token-file`: a box reached over a
network has a login, docs/metrics.md#access); the whole behind the panel's HTTP gate (`WebGate`: Host, forwarding
and Origin checks) on the box's address. What the page would add (the Chat tab, self-test and A/B services) exports
no series of its own but the self-test figures, read from the state dir as the panel reads them.

The gateway's figures: the panel gets them as its gateway process's reports (`{"metrics": ...}` every
gwmetrics.REPORT_S, gateway/switch.py); here the gateway runs on a thread of this process, so its `report` callback
is `GatewayFigures.report` and the collector reads the latest the same way (`GatewayFigures.metrics`)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.backend.config.settings import Settings
    from app.backend.contracts import GpuReader, Receive, Scope, Send
    from app.backend.engine.controller import EngineController
    from app.backend.gateway.keys import KeyStore
    from app.backend.state import AppState

DEFAULT_PORT = 7860  # the panel's own default port (`moet-panel serve`)


class GatewayFigures:
    """The in-process gateway's reports, kept as the panel's GatewayService keeps its child's (`metrics()`,
    `keys`: the two things the collector and the metrics route ask of `AppState.gateway`)."""

    def __init__(self, keys: KeyStore) -> None:
        self.keys = keys
        self.latest: dict[str, object] | None = None
        self.serving = False

    def report(self, msg: dict[str, object]) -> None:
        m = msg.get("metrics")
        if isinstance(m, dict):
            self.latest = m

    def metrics(self) -> tuple[dict[str, object] | None, bool]:
        return self.latest, self.serving


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    """Behind the gate, where the panel has Gradio's page: this box serves /metrics only."""
    if scope.get("type") != "http":
        return
    body = b"this SIMULATED box serves /metrics only (bench/fleet/boxmetrics.py)\n"
    await send({"type": "http.response.start", "status": 404,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class BoxMetrics:
    """Start with `start()`; `close()` stops the server, the telemetry hub and the download manager."""

    def __init__(self, settings: Settings, engine: EngineController, reader: GpuReader, gateway: GatewayFigures,
                 host: str, port: int, token_file: Path) -> None:
        import uvicorn

        from app.backend.download.manager import DownloadManager
        from app.backend.prometheus.access import PATH, MetricsAccess, MetricsRoute, load_token
        from app.backend.state import AppState
        from app.backend.telemetry.gpu_sim import SimulatedGpuReader
        from app.backend.telemetry.sampler import TelemetrySampler
        from app.backend.web.gate import GatePolicy, WebGate

        token = load_token(token_file)  # refused as the panel refuses it: unsafe mode, too short
        sim_card = reader if isinstance(reader, SimulatedGpuReader) else None
        telemetry = TelemetrySampler(settings, engine=engine, gpu_reader=reader, sim_card=sim_card)
        # the collector reads AppState.gateway through `metrics()` and `keys` only (duck-typed: see the class above)
        gw: Any = gateway
        self.state: AppState = AppState(settings=settings, engine=engine, gpu=reader, telemetry=telemetry,
                                        downloads=DownloadManager(settings), gateway=gw)
        route = MetricsRoute(self.state, MetricsAccess(auth_on=True, token=token))
        app = WebGate(_not_found, GatePolicy(port=port, bind_host=host, routes=((PATH, route),),
                                             on_refusal=self.state.counters.refused))
        self.url = f"http://{host}:{port}{PATH}"
        self._server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                                     lifespan="off", server_header=False))
        self._thread: threading.Thread | None = None
        self.error = ""

    def start(self, timeout_s: float = 20.0) -> bool:
        assert self.state.telemetry is not None
        self.state.telemetry.start()

        def run() -> None:
            try:
                asyncio.run(self._server.serve())
            except BaseException as exc:  # shown by the caller (simbox says it on stdout)
                self.error = f"{type(exc).__name__}: {exc}"

        self._thread = threading.Thread(target=run, name="box-metrics", daemon=True)
        self._thread.start()
        end = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > end:
                self.error = self.error or f"not listening on {self.url} within {timeout_s:.0f} s"
                return False
            time.sleep(0.02)
        return True

    def close(self) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        if self.state.telemetry is not None:
            self.state.telemetry.close()
        if self.state.downloads is not None:
            self.state.downloads.close()
