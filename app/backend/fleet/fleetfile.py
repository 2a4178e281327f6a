"""The fleet file: `<state dir>/fleet.json` (0600: it holds the fleet key and the boxes' metrics tokens).

One fleet key for every box: vLLM's router forwards the front's `Authorization` header unchanged to whichever box
it picks (docs/fleet.md#trust), so the boxes must all accept the same key; each box stores only its hash
(`moet-panel keys create front --scope fleet --key-stdin`). No fleet file: one box alone, exactly as before."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, replace
from pathlib import Path

from app.backend.files.jsonstore import JsonStore
from app.backend.gateway.keys import KEY_PREFIX

FILE_NAME = "fleet.json"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")
ROUTER_PORT = 30100  # the router's inference port, on the front's loopback only (never a client's)
ROUTER_METRICS_PORT = 29100  # its Prometheus exporter (its own default, 29000, is set explicitly: one per front)
# docs/fleet.md#the-routing-policy: the least busy box, a session (X-Session-ID) kept on its box
POLICY = "round_robin"


class FleetError(ValueError):
    """A fleet operation was refused and nothing was changed; the message says why and what to do."""


@dataclass(frozen=True)
class Box:
    name: str
    url: str  # the box's gateway, e.g. https://box2.lan:8001 (the router's worker URL)
    metrics_url: str = ""  # the box's panel /metrics (federated by Prometheus; the Fleet tab reads it)
    metrics_token: str = ""  # a bearer token of scope metrics on that panel ("" when it has no login)


@dataclass(frozen=True)
class FleetConfig:
    fleet_key: str
    boxes: tuple[Box, ...] = ()
    router_port: int = ROUTER_PORT
    router_metrics_port: int = ROUTER_METRICS_PORT
    policy: str = POLICY
    model: str = ""  # the served name every box must serve (set by the first box that joins serving one)
    health_interval_s: int = 1  # the router's health checks: a draining box is out within ~2 s

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def box(self, name: str) -> Box | None:
        return next((b for b in self.boxes if b.name == name), None)


def store(state_dir: Path) -> JsonStore[FleetConfig]:
    return JsonStore(Path(state_dir) / FILE_NAME, FleetConfig)


def load(state_dir: Path) -> FleetConfig | None:
    """The fleet, or None: no fleet file (one box alone)."""
    return store(state_dir).read()


def new_fleet(state_dir: Path, router_port: int = ROUTER_PORT, router_metrics_port: int = ROUTER_METRICS_PORT) -> FleetConfig:
    """Make the fleet file with a new fleet key (refused when one exists: its key is already on the boxes)."""
    if load(state_dir) is not None:
        raise FleetError(f"a fleet file exists ({Path(state_dir) / FILE_NAME}); `moet-panel fleet key` prints its key")
    cfg = FleetConfig(fleet_key=KEY_PREFIX + secrets.token_urlsafe(32), router_port=router_port,
                      router_metrics_port=router_metrics_port)
    store(state_dir).write(cfg)
    return cfg


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise FleetError(f"box name {name!r}: 1-32 letters, digits, '.', '_' or '-' (it labels the box's metrics)")
    return name


def with_box(cfg: FleetConfig, box: Box) -> FleetConfig:
    return replace(cfg, boxes=(*cfg.boxes, box))


def without_box(cfg: FleetConfig, name: str) -> FleetConfig:
    return replace(cfg, boxes=tuple(b for b in cfg.boxes if b.name != name))
