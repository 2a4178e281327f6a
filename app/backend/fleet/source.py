"""The front gateway's view of the fleet (an `EngineStatusSource`, docs/gateway.md): its upstream is the router on
loopback; it accepts while the router answers and at least one box serves; its fair queue's slots are the
serving boxes' slots summed (docs/fleet.md#keys-usage-and-fair-turns). Every box is asked its status with the
fleet key once a second, all at once (httpx's async client: one slow box never delays the others)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx

from app.backend import oplog
from app.backend.fleet.boxes import STATUS_PATH, BoxStatus, parse_status
from app.backend.fleet.fleetfile import FleetConfig
from app.backend.gateway import fleetside
from app.backend.gateway.engine_status import EngineStatus

END_TIMEOUT_S = 1.0  # a box asked to end a request: within this, or it ends when the router closes (DRAIN_S later)
ROUTER_DOWN = "the fleet's router is restarting (the panel restarts it); try again in a few seconds"


def fleet_status(cfg: FleetConfig, boxes: list[BoxStatus], router_up: bool,
                 routed: set[str] | None = None) -> EngineStatus:
    """The front's status from its boxes' and the router's (a pure function: tests feed it). `routed`: the names
    of the boxes the router lists healthy (None: not known); a box serves the fleet when it serves and is routed."""
    serving = [b for b in boxes if b.serving and (routed is None or b.name in routed)]
    name = next((b.served_name for b in serving if b.served_name), "")
    if not router_up:
        return EngineStatus(False, cfg.router_url, name, ROUTER_DOWN, "router_down", retry_after_s=5.0)
    if not serving:
        why = "; ".join(f"{b.name}: {b.error or b.state or 'not serving'}" for b in boxes) or "no box in the fleet file"
        return EngineStatus(False, cfg.router_url, name, f"no box of the fleet serves now ({why})", "no_box")
    return EngineStatus(True, cfg.router_url, name, state="ready", slots=sum(b.slots for b in serving))


class FleetSource:
    def __init__(self, load: Callable[[], FleetConfig | None], interval_s: float = 1.0, timeout_s: float = 1.5):
        self._load = load
        self._interval = interval_s
        self._timeout = timeout_s
        cfg = load()
        self._cfg = cfg
        self._status = EngineStatus(False, cfg.router_url if cfg else "http://127.0.0.1:9", "",
                                    "the front has not reached its boxes yet", "unknown")
        self.boxes: list[BoxStatus] = []
        self.router_up = False
        self.routed: set[str] = set()  # the boxes the router lists healthy
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self.checked_at = 0.0
        self._lost = asyncio.Event()  # set (then replaced) when a box that answered stops answering
        self._misses: dict[str, int] = {}  # polls in a row each box did not answer

    def box_lost(self) -> asyncio.Event:
        """The proxy waits on this while a request has no answer headers yet (proxy.GatewayApp._request)."""
        return self._lost

    def status(self) -> EngineStatus:
        return self._status

    def models_body(self) -> bytes:
        """`GET /v1/models` answered by the front (the router's own answers 500 while any box is down: router#135)."""
        name = self._status.served_name or next((b.served_name for b in self.boxes if b.served_name), "")
        data = [{"id": name, "object": "model", "created": 0, "owned_by": "moet-panel"}] if name else []
        return json.dumps({"object": "list", "data": data}).encode()

    async def _box(self, cfg: FleetConfig, name: str, url: str) -> BoxStatus:
        assert self._client is not None
        try:
            r = await self._client.get(url.rstrip("/") + STATUS_PATH, headers={"Authorization": f"Bearer {cfg.fleet_key}"})
        except httpx.HTTPError as exc:
            return BoxStatus(name, False, error=f"does not answer ({type(exc).__name__})")
        return parse_status(name, r.status_code, r.text)

    async def _router(self, cfg: FleetConfig) -> set[str] | None:
        """The names of the boxes the router lists healthy; None when it does not answer."""
        assert self._client is not None
        try:
            r = await self._client.get(cfg.router_url + "/workers")
            workers = r.json().get("workers") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        if not isinstance(workers, list):
            return None
        healthy = {str(w.get("url", "")).rstrip("/") for w in workers if isinstance(w, dict) and w.get("is_healthy")}
        return {b.name for b in cfg.boxes if b.url.rstrip("/") in healthy}

    async def probe_once(self) -> EngineStatus:
        cfg = self._load() or self._cfg
        if cfg is None:
            return self._status
        self._cfg = cfg
        results = await asyncio.gather(self._router(cfg), *(self._box(cfg, b.name, b.url) for b in cfg.boxes))
        routed = results[0] if isinstance(results[0], set) else None
        boxes = [r for r in results[1:] if isinstance(r, BoxStatus)]
        # lost: twice in a row without an answer (a box busy switching can miss one 1.5 s poll on a loaded host)
        gone = [b for b in boxes if not b.reachable and self._misses.get(b.name) == 1]
        self._misses = {b.name: (0 if b.reachable else self._misses.get(b.name, 0) + 1) for b in boxes}
        if gone:
            await self._lose(cfg, gone)
            routed = (routed or set()) - {b.name for b in gone}
        before = self._status
        self.boxes, self.router_up, self.routed = boxes, routed is not None, routed or set()
        self._status = fleet_status(cfg, boxes, routed is not None, routed)
        self.checked_at = time.monotonic()
        if before.accepts != self._status.accepts or before.slots != self._status.slots:
            oplog.decision("fleet", "front_status", who=oplog.PANEL, accepts=self._status.accepts,
                           slots=self._status.slots, serving=sum(1 for b in boxes if b.serving), boxes=len(boxes),
                           router_up=self.router_up)
        return self._status

    async def _lose(self, cfg: FleetConfig, gone: list[BoxStatus]) -> None:
        """A box stopped answering (link cut, frozen): the router lets it go at once (its own health checks take
        seconds, meanwhile it would send it more requests, which hang), requests waiting on it are sent again;
        the supervisor adds it back once its health check answers (router.RouterSupervisor.reconcile)."""
        assert self._client is not None
        for b in gone:
            box = cfg.box(b.name)
            if box is None:
                continue
            try:
                await self._client.post(cfg.router_url + "/remove_worker", params={"url": box.url.rstrip("/")})
            except httpx.HTTPError as exc:
                oplog.caught("fleet", exc, "taking a lost box out of the router", box=b.name)
            oplog.decision("fleet", "box_lost", who=oplog.PANEL, box=b.name, error=b.error)
        self.wake_waiting()

    async def end_request(self, request_id: str) -> int:
        """The front's client left: every box ends the request of that id at its engine and sends the rest of it,
        its counts included, through the router (gateway/fleetside.py END_PATH; all boxes at once: the router does
        not say which box it chose, and a request sent again may be on two). Returns how many boxes ended one."""
        cfg = self._cfg
        if cfg is None or self._client is None:
            return 0
        client = self._client
        headers = {"Authorization": f"Bearer {cfg.fleet_key}", fleetside.REQUEST_HEADER: request_id}

        async def one(url: str) -> int:
            try:
                r = await client.post(url.rstrip("/") + fleetside.END_PATH, headers=headers, timeout=END_TIMEOUT_S)
                return int(r.json().get("ended", 0)) if r.status_code == 200 else 0
            except (httpx.HTTPError, ValueError, AttributeError):
                return 0  # a box lost or not updated: its engine ends when the router closes its connection

        return sum(await asyncio.gather(*(one(b.url) for b in cfg.boxes)))

    def wake_waiting(self) -> None:
        """Every request still waiting for its answer's first bytes is sent again (proxy.GatewayApp._request):
        nothing reached its client, and the box it waits on may be the one lost."""
        self._lost.set()
        self._lost = asyncio.Event()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.probe_once()
            except Exception as exc:  # one bad answer must not end the front's view of its boxes
                oplog.caught("fleet", exc, "asking the boxes their status", traceback=True)

    async def start(self) -> None:
        self._client = httpx.AsyncClient(timeout=self._timeout)
        await self.probe_once()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if self._client is not None:
            await self._client.aclose()
