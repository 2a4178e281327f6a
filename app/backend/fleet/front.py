"""The front's gateway: the moet-panel gateway as it is (keys, usage, limits, the fair queue, the allow-list),
its upstream the router on loopback (docs/fleet.md#what-runs-where). Three settings make it the front: its
status is the fleet's (`FleetSource`), the fleet key goes upstream with every request (the router forwards it to
the box it picks), and the model list is answered here."""

from __future__ import annotations

from pathlib import Path

from app.backend.fleet import fleetfile
from app.backend.fleet.source import FleetSource
from app.backend.gateway.engine_status import EngineStatus, EngineStatusSource
from app.backend.gateway.keys import KeyStore
from app.backend.gateway.server import GatewayConfig, GatewayServer

UPSTREAM_IDLE_S = 10.0  # a box streams a token every few ms to a second; 10 s of nothing mid-answer: it is gone
# before the first byte after the headers: a queue ahead of it on the box, or a long prefill (seen: 10 s waits
# under 6 clients on one box of one slot, ended by the idle bound though nothing was wrong)
UPSTREAM_FIRST_S = 30.0
# ... plus the prompt's prefill, which no bound of a few seconds fits (a 260,000-token prompt): 4,000 bytes a second,
# ~1,000 tokens at ~4 bytes a token, below a GPU's prefill of this model; a lost box is found by the status watch
# within ~2.5 s anyway (fleet/source.py), so this bound only ends a box that answers its status but never its stream
PREFILL_BYTES_PER_S = 4000.0


def make_front(server: GatewayServer, source: FleetSource, fleet_key: str) -> None:
    app = server.app
    app.upstream_headers = {"authorization": f"Bearer {fleet_key}"}
    app.models_answer = source.models_body
    # a box cut off or frozen mid-answer: TCP would hold the stream for minutes (docs/fleet.md#faults)
    app.upstream_idle_s = UPSTREAM_IDLE_S
    app.upstream_first_s = UPSTREAM_FIRST_S
    app.upstream_first_per_byte_s = 1.0 / PREFILL_BYTES_PER_S
    app.box_lost = source.box_lost
    app.end_upstream = source.end_request  # a hang-up at the front ends the box's request, its counts read (docs/fleet.md)


def front_server(cfg: GatewayConfig, keys: KeyStore, state_dir: Path) -> GatewayServer:
    fleet = fleetfile.load(state_dir)
    if fleet is None:
        raise ValueError("no fleet file: `moet-panel fleet init` first")
    source = FleetSource(lambda: fleetfile.load(state_dir))
    server = GatewayServer(cfg, keys, source)
    make_front(server, source, fleet.fleet_key)
    return server


class FrontSource:
    """The panel's front gateway process: the fleet's status (`FleetSource`), and the panel's status pipe kept
    open for its EOF (the panel gone: the gateway stops, docs/gateway.md "How the panel runs it")."""

    def __init__(self, fleet: FleetSource, pipe: EngineStatusSource) -> None:
        self.fleet = fleet
        self.pipe = pipe

    def status(self) -> EngineStatus:
        return self.fleet.status()

    async def start(self) -> None:
        await self.pipe.start()
        await self.fleet.start()

    async def stop(self) -> None:
        await self.fleet.stop()
        await self.pipe.stop()
