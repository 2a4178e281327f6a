"""The front's part of the panel (docs/fleet.md#what-runs-where): with a fleet file in its state dir, the panel
runs vLLM's router on loopback (`RouterSupervisor`: started, restarted when it ends, stopped with the panel) and
keeps the fleet's view for the Fleet tab (every box's status and the router's health, asked on a thread of its own
every 2 s, the boxes all at once: a frozen box bounds a refresh at its 1.5 s timeout, not 3 s each in turn; the page
reads the latest). The panel's gateway, on the same state dir, is the front by the same file
(app/cli/gateway.py). No fleet file: none of this exists (one box alone, exactly as before)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from app.backend import oplog
from app.backend.fleet import fleetfile
from app.backend.fleet.boxes import BoxStatus, RateBook, generated_tokens, status
from app.backend.fleet.router import RouterAdmin, RouterSupervisor

VIEW_EVERY_S = 2.0
ASK_TIMEOUT_S = 1.5  # a box's status or /metrics; a refresh asks every box's both at once
ASKERS = 16  # threads asking boxes (a fleet of more boxes asks them in waves)


@dataclass(frozen=True)
class BoxFigures:
    """From the box's panel /metrics (its `metrics_url`), when the fleet file gives one."""

    profiles: tuple[str, ...] = ()  # the profile each live engine runs (moet_panel_engine_profile_info)
    vram_used_gib: float | None = None  # over the box's GPUs (moet_panel_gpu_memory_used_bytes)
    vram_total_gib: float | None = None
    pool_coverage: float | None = None  # moet_panel_pool_coverage_ratio, 0-1
    generated_tokens: float | None = None  # its gateway's completion tokens, a counter (boxes.generated_tokens)
    simulated: bool = False  # its engine or GPU is a SIMULATED double (series labelled simulated="1")
    error: str = ""


@dataclass(frozen=True)
class BoxView:
    box: BoxStatus
    router_healthy: bool | None  # None: the router does not list it
    figures: BoxFigures = BoxFigures()
    tokens_per_s: float | None = None  # the rate of figures.generated_tokens (boxes.CounterRate); None: not known


def box_figures(metrics_url: str, token: str, timeout_s: float = 1.5) -> BoxFigures:
    """The few figures the Fleet tab shows, read from a box's panel /metrics (Prometheus text)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    if not metrics_url:
        return BoxFigures()
    try:
        r = httpx.get(metrics_url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=timeout_s)
        r.raise_for_status()
        fams = {f.name: f.samples for f in text_string_to_metric_families(r.text)}
        generated = generated_tokens((s.name, s.labels, s.value) for ss in fams.values() for s in ss)
    except (httpx.HTTPError, ValueError) as exc:
        return BoxFigures(error=f"its /metrics: {type(exc).__name__}")
    gib = 2.0 ** 30
    used = [s.value for s in fams.get("moet_panel_gpu_memory_used_bytes", [])]
    total = [s.value for s in fams.get("moet_panel_gpu_memory_total_bytes", [])]
    cov = [s.value for s in fams.get("moet_panel_pool_coverage_ratio", [])]
    return BoxFigures(tuple(str(s.labels.get("profile", "")) for s in fams.get("moet_panel_engine_profile_info", [])),
                      sum(used) / gib if used else None, sum(total) / gib if total else None,
                      cov[0] if cov else None, generated,
                      any(s.labels.get("simulated") == "1" for ss in fams.values() for s in ss))


@dataclass(frozen=True)
class FleetView:
    boxes: tuple[BoxView, ...] = ()
    router_pid: int | None = None
    router_starts: int = 0
    taken_at: float = field(default_factory=time.time)
    asked: bool = False  # False: the view before the boxes were first asked (the panel's first 2 s)


class FleetFront:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.router = RouterSupervisor(self.state_dir, self.load)
        self._view = FleetView()
        self._rates = RateBook()  # tok/s per box, from the scrapes of its /metrics
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fleet-view", daemon=True)
        self._askers = ThreadPoolExecutor(ASKERS, thread_name_prefix="fleet-ask")

    def load(self) -> fleetfile.FleetConfig | None:
        return fleetfile.load(self.state_dir)

    def start(self) -> None:
        self.router.start()
        self._thread.start()

    def view(self) -> FleetView:
        return self._view

    def _watch(self) -> None:
        while not self._stop.wait(VIEW_EVERY_S):
            cfg = self.load()
            if cfg is None:
                continue
            try:
                health = {str(w.get("url", "")).rstrip("/"): bool(w.get("is_healthy"))
                          for w in RouterAdmin(cfg).workers()}
                self._view = self.refresh(cfg, health)
            except Exception as exc:  # the view must keep going; said once per kind of error
                oplog.caught("fleet", exc, "refreshing the fleet's view", traceback=True)

    def refresh(self, cfg: fleetfile.FleetConfig, health: dict[str, bool]) -> FleetView:
        """Every box asked at once (its status and its /metrics), `health` the router's word per worker URL."""
        statuses = [self._askers.submit(status, b, cfg.fleet_key, ASK_TIMEOUT_S) for b in cfg.boxes]
        figures = [self._askers.submit(_scraped, b.metrics_url, b.metrics_token) for b in cfg.boxes]
        views = []
        for b, st, fig in zip(cfg.boxes, statuses, figures, strict=True):
            at, figs = fig.result()
            rate = self._rates.add(b.name, at, figs.generated_tokens)
            views.append(BoxView(st.result(), health.get(b.url.rstrip("/")), figs, rate))
        self._rates.keep(b.name for b in cfg.boxes)
        return FleetView(tuple(views), self.router.pid, self.router.starts, asked=True)

    def close(self) -> None:
        self._stop.set()
        self.router.stop()
        self._askers.shutdown(wait=False, cancel_futures=True)


def _scraped(metrics_url: str, token: str) -> tuple[float, BoxFigures]:
    """A box's figures with the moment they were read (its tok/s is the counter's rate between reads)."""
    figs = box_figures(metrics_url, token, ASK_TIMEOUT_S)
    return time.monotonic(), figs


def start_front(state_dir: Path) -> FleetFront | None:
    """The front's parts when this panel's state dir holds a fleet file; None otherwise."""
    if fleetfile.load(state_dir) is None:
        return None
    front = FleetFront(state_dir)
    front.start()
    return front
