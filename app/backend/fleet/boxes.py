"""Asking a box's gateway what the front needs (fleetside.py on the box): its health, its status with the fleet
key, its model; and its tokens per second, a rate of its panel's /metrics counter (below). Plain HTTP calls with
short timeouts; every failure becomes a sentence that names the box."""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Iterable, Mapping
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


# --- tok/s per box, from its panel's /metrics (the Fleet tab; docs/fleet.md#one-dashboard) -----------------------
# The box's gateway counts the tokens it billed, by key and kind (docs/metrics.md): the completion tokens are what
# its engine generated for the front's requests. The panel exports no live decode rate, so the front derives one as
# Prometheus' rate() does: the counter's increase between scrapes, a reset (the box's gateway restarted: it counts
# from 0) taken as a start from 0, over the time between the first and last scrape of the window.
GENERATED_SERIES = "moet_panel_gateway_tokens_total"  # {kind="completion"}
GATEWAY_UP_SERIES = "moet_panel_gateway_up"
# The box's gateway reports its counters to its panel every 2 s and the front reads them every ~2 s: a rate over one
# pair of scrapes would swing between 0 and twice the truth; over ~10 s it moves by a few tokens a second.
RATE_WINDOW_S = 10.0


def generated_tokens(samples: Iterable[tuple[str, Mapping[str, str], float]]) -> float | None:
    """The completion tokens a box's gateway billed, summed over keys, from its /metrics samples (name, labels,
    value); None when the exposition has no gateway series (not a moet-panel, or one without the gateway)."""
    up = False
    total = 0.0
    for name, labels, value in samples:
        if name == GATEWAY_UP_SERIES:
            up = True
        elif name == GENERATED_SERIES and labels.get("kind") == "completion":
            total += value
    return total if up else None


@dataclass(frozen=True)
class CounterSample:
    at: float  # when the front read it (monotonic s)
    value: float


class CounterRate:
    """One counter's rate per second over the scrapes of the last `window_s`, as Prometheus' rate(): increases
    summed pair by pair (a drop is a reset: the counter restarted from 0), divided by the time the scrapes span.
    No rate from a single scrape; a scrape that failed forgets the history (the box's counter may have been reset
    meanwhile, and an old scrape would spread what it did since over a time it did not answer)."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: deque[CounterSample] = deque()

    def add(self, at: float, value: float | None) -> float | None:
        """Record a scrape (`value` None: the box did not answer, or exported no counter); the rate now, or None."""
        if value is None:
            self._samples.clear()
            return None
        if self._samples and at <= self._samples[-1].at:  # a clock that did not move: no time to divide by
            return self.rate()
        self._samples.append(CounterSample(at, value))
        while len(self._samples) > 2 and at - self._samples[1].at >= self.window_s:
            self._samples.popleft()  # the window keeps one scrape at or past its start: it spans ~window_s
        return self.rate()

    def rate(self) -> float | None:
        if len(self._samples) < 2:
            return None
        s = list(self._samples)
        increase = sum(b.value - a.value if b.value >= a.value else b.value for a, b in itertools.pairwise(s))
        return increase / (s[-1].at - s[0].at)


class RateBook:
    """A CounterRate per box name; boxes gone from the fleet file are forgotten."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._rates: dict[str, CounterRate] = {}

    def add(self, name: str, at: float, value: float | None) -> float | None:
        return self._rates.setdefault(name, CounterRate(self.window_s)).add(at, value)

    def keep(self, names: Iterable[str]) -> None:
        keep = set(names)
        self._rates = {n: r for n, r in self._rates.items() if n in keep}
