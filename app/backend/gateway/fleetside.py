"""A box behind a fleet's front (docs/fleet.md#trust): what its gateway answers the front and the router.

A box holding an active key of scope `fleet` (`moet-panel keys create front --scope fleet --key-stdin`) is a
fleet member: its gateway then serves that key alone (an owner's inference key is refused: clients go to the
front, which holds their keys, usage and fair turns) and answers two more routes:

* `GET /health`, with no key: 200 while it serves, 503 while it drains or nothing serves. vLLM's router checks it
  (a plain GET with no key: router#159) and takes a box that drains out of its rotation.
* `GET /fleet/status`, with the fleet key: the box's status as the front needs it (slots summed into the front's
  fair queue, the served model checked by `moet-panel fleet add`).
* `POST /fleet/end`, with the fleet key and a request's `x-moet-request` id: the front's client left (or the front
  ended it); the box ends that request at its engine and sends the front the rest of what the engine wrote, its
  counts included, then ends the answer. The router cannot carry a hang-up any other way: it closes both its
  connections at once, so the engine's last counts never reached the front (docs/fleet.md "Usage at the front").

The fleet key's streams keep the engine's counts on every chunk (the router drops `continuous_usage_stats` from
`stream_options`, so the box cannot see whether the front asked): the front reads them and keeps from its own
client what that client did not ask for.

A box with no fleet key answers none of them, exactly as before (404)."""

from __future__ import annotations

import json

from app.backend.gateway.engine_status import EngineStatus

HEALTH_PATH = "/health"
STATUS_PATH = "/fleet/status"
END_PATH = "/fleet/end"
MEMBER_ROUTES = {STATUS_PATH: "GET", END_PATH: "POST"}  # a fleet member's routes besides the generation ones
REQUEST_HEADER = "x-moet-request"  # the front's id of a request, the same on every copy it sends (the router passes it)


def health(engine: EngineStatus) -> tuple[int, bytes]:
    """(HTTP status, JSON body) of the unauthenticated health check: it says serving or not, nothing more."""
    if engine.accepts:
        return 200, b'{"status":"serving"}'
    return 503, json.dumps({"status": "draining" if engine.draining else "not serving"}).encode()


def status_body(engine: EngineStatus, in_flight: int) -> bytes:
    """The box's status for its front (fleet key only): served model, slots, drain, per GPU."""
    return json.dumps({
        "serving": engine.accepts, "served_name": engine.served_name, "slots": engine.slots, "state": engine.state,
        "draining": engine.draining, "reason": engine.reason, "retry_after_s": engine.retry_after_s,
        "in_flight": in_flight,
        "engines": [{"gpu": e.gpu, "serving": e.accepts, "state": e.state, "slots": e.slots, "draining": e.draining}
                    for e in engine.engines],
    }, separators=(",", ":")).encode()


def request_id(headers: dict[str, bytes]) -> str:
    """The front's id of a request (a fleet key's request only; at most 64 characters of it): "" when none."""
    return headers.get(REQUEST_HEADER, b"").decode("latin-1")[:64]
