"""Counters of things that happen in the web layer (the engine's restarts, switches and canary are counted in
its snapshot, the one source: docs/engine.md, "events out"), kept in the one
AppState (`state.counters`) and read by the /metrics collector (docs/metrics.md).

Each counter is an int bumped under one lock; readers get a copy. Nothing here imports the web gate,
the auth module or the engine: they call these methods, so their own edits stay a line each.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

# The gate's refusals by HTTP status (app/backend/web/gate.py, in the order it checks): the label a
# dashboard shows. A status the gate does not use today is counted as "other".
REFUSAL_REASONS = {421: "host", 400: "forwarding_header", 403: "origin", 404: "unused_route", 405: "method",
                   401: "no_session", 413: "body_too_large"}


@dataclass
class PanelCounters:
    """Monotonic counts since the panel process started (Prometheus handles the reset at a restart)."""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _refusals: Counter[str] = field(default_factory=Counter)
    _logins: Counter[str] = field(default_factory=Counter)
    _metrics_denied: Counter[str] = field(default_factory=Counter)

    # -- writers ---------------------------------------------------------------------------------
    def refused(self, status: int) -> None:
        """The web gate refused a request with this status."""
        with self._lock:
            self._refusals[REFUSAL_REASONS.get(status, "other")] += 1

    def login_failed(self, reason: str) -> None:
        """A sign-in failed: "bad_credentials" or "locked_out" (the throttle refused it unchecked)."""
        with self._lock:
            self._logins[reason] += 1

    def metrics_denied(self, reason: str) -> None:
        """A /metrics request without the right bearer token ("no_token", "bad_token", "no_token_file")."""
        with self._lock:
            self._metrics_denied[reason] += 1

    # -- readers ---------------------------------------------------------------------------------
    def refusals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._refusals)

    def login_failures(self) -> dict[str, int]:
        with self._lock:
            return dict(self._logins)

    def metrics_denials(self) -> dict[str, int]:
        with self._lock:
            return dict(self._metrics_denied)
