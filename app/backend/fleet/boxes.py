"""Asking a box's gateway what the front needs (fleetside.py on the box): its health, its status with the fleet
key, its model. Plain HTTP calls with short timeouts; every failure becomes a sentence that names the box."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx

from app.backend.fleet.fleetfile import Box, FleetError

STATUS_PATH = "/fleet/status"
HEALTH_PATH = "/health"


@dataclass(frozen=True)
class BoxStatus:
    name: str
    reachable: bool
    serving: bool = False
    served_name: str = ""
    slots: int = 0
    state: str = ""
    draining: bool = False
    in_flight: int = 0
    engines: tuple[dict[str, object], ...] = ()
    error: str = ""  # why not reachable or refused ("" when it answered)

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "reachable": self.reachable, "serving": self.serving, "served_name": self.served_name,
                "slots": self.slots, "state": self.state, "draining": self.draining, "in_flight": self.in_flight,
                "engines": list(self.engines), "error": self.error}


def parse_status(name: str, code: int, text: str) -> BoxStatus:
    """A box's answer to `GET /fleet/status` (with the fleet key) as a BoxStatus; refusals named."""
    if code == 401:
        return BoxStatus(name, True, error="the box refused the fleet key (401): give it the front's key with "
                         "`moet-panel fleet key | moet-panel keys create front --scope fleet --key-stdin` on the box")
    if code == 404:
        return BoxStatus(name, True, error="the box holds no fleet key (its gateway answers 404 to /fleet/status): "
                         "give it the front's key with `moet-panel keys create front --scope fleet --key-stdin`")
    if code != 200:
        return BoxStatus(name, True, error=f"the box's gateway answered {code} to {STATUS_PATH}")
    try:
        d = json.loads(text)
        return BoxStatus(name, True, d.get("serving") is True, str(d.get("served_name") or ""),
                         int(d.get("slots") or 0), str(d.get("state") or ""), d.get("draining") is True,
                         int(d.get("in_flight") or 0),
                         tuple(e for e in d.get("engines") or () if isinstance(e, dict)))
    except (ValueError, TypeError, AttributeError) as exc:
        return BoxStatus(name, True, error=f"the box's {STATUS_PATH} is not a status ({exc})")


def status(box: Box, fleet_key: str, timeout_s: float = 3.0) -> BoxStatus:
    """One box's status, asked now (the CLI; the front's gateway asks all boxes at once: source.py)."""
    try:
        r = httpx.get(box.url.rstrip("/") + STATUS_PATH, headers={"Authorization": f"Bearer {fleet_key}"},
                      timeout=timeout_s, verify=True)
    except httpx.HTTPError as exc:
        return BoxStatus(box.name, False, error=f"the box's gateway does not answer at {box.url} "
                         f"({type(exc).__name__}: {exc or 'no answer'})")
    return parse_status(box.name, r.status_code, r.text)


def check_joinable(box: Box, fleet_key: str, served_name: str) -> BoxStatus:
    """Before a box joins: it answers, takes the fleet key, and serves the fleet's model (when the fleet has one).
    Raises FleetError naming what is wrong; nothing is changed."""
    st = status(box, fleet_key)
    if st.error:
        raise FleetError(f"box {box.name!r}: {st.error}")
    if served_name and st.served_name and st.served_name != served_name:
        raise FleetError(f"box {box.name!r} serves {st.served_name!r}, the fleet serves {served_name!r}: one fleet "
                         "serves one model (clients name it); switch that box's recipe first")
    return st
