"""`moet-panel fleet add|remove`: change the fleet file, then tell a running router (`/add_worker`,
`/remove_worker`: no restart). Every check comes first and a refusal changes nothing (docs/fleet.md#configuration):
a box that does not answer, refuses the fleet key, serves another model, or a name or address already listed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

from app.backend import oplog
from app.backend.fleet import fleetfile
from app.backend.fleet.boxes import BoxStatus, check_joinable
from app.backend.fleet.fleetfile import Box, FleetConfig, FleetError
from app.backend.fleet.router import RouterAdmin, box_healthy


def _loaded(state_dir: Path) -> FleetConfig:
    cfg = fleetfile.load(state_dir)
    if cfg is None:
        raise FleetError("no fleet here yet: `moet-panel fleet init` makes the fleet file and its key")
    return cfg


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query:
        raise FleetError(f"{url!r} is not a gateway address: expected http(s)://HOST:PORT (the box's `moet-panel "
                         "gateway` or Access tab address)")
    return url.rstrip("/")


def add_box(state_dir: Path, name: str, url: str, metrics_url: str = "", metrics_token: str = "", *,
            who: str = oplog.PANEL) -> tuple[BoxStatus, str]:
    """Checks, writes, tells the router. Returns (the box's status, what the router said: "" when it took it, else
    why not yet; the supervisor adds it once it answers its health check)."""
    cfg = _loaded(state_dir)
    fleetfile.check_name(name)
    url = check_url(url)
    if metrics_url:
        check_url(metrics_url.removesuffix("/metrics"))
    if cfg.box(name) is not None:
        raise FleetError(f"a box named {name!r} is in the fleet already (`moet-panel fleet remove {name}` first)")
    same = next((b for b in cfg.boxes if b.url.rstrip("/") == url), None)
    if same is not None:
        raise FleetError(f"{url} is box {same.name!r} already")
    box = Box(name, url, metrics_url, metrics_token)
    st = check_joinable(box, cfg.fleet_key, cfg.model)
    new = fleetfile.with_box(cfg, box)
    if not new.model and st.served_name:
        new = replace(new, model=st.served_name)
    fleetfile.store(state_dir).write(new)
    oplog.decision("fleet", "box_added", who=who, box=name, url=url, serving=st.serving, slots=st.slots)
    admin = RouterAdmin(new, timeout_s=6.0)
    if not admin.alive():
        return st, "the router is not running here now; it takes the box when the front starts"
    if not box_healthy(url):
        return st, "the box does not serve now (its /health is not 200); the router takes it once it does"
    return st, admin.add(url)


def remove_box(state_dir: Path, name: str, *, who: str = oplog.PANEL) -> str:
    """Returns what the router said ("" when it let the box go or is not running)."""
    cfg = _loaded(state_dir)
    box = cfg.box(name)
    if box is None:
        raise FleetError(f"no box named {name!r} in the fleet (`moet-panel fleet list`)")
    new = fleetfile.without_box(cfg, name)
    fleetfile.store(state_dir).write(new)
    oplog.decision("fleet", "box_removed", who=who, box=name, url=box.url)
    admin = RouterAdmin(new)
    return admin.remove(box.url) if admin.alive() else ""
