"""vLLM's router (`vllm-router`, PyPI) on the front's loopback, started, supervised and restarted by the panel
like any other part (docs/fleet.md#what-runs-where), and its admin routes (`/add_worker`, `/remove_worker`,
`/workers`), which share its inference port: it listens on 127.0.0.1 only, and the front's gateway (the one
address clients reach) forwards nothing but its allow-list, so no client reaches them.

Why these flags (checked against 0.1.17, docs/fleet.md#the-router-as-installed):
* `--health-check-interval-secs 1 --health-failure-threshold 2 --health-success-threshold 1`: its defaults (60 s,
  3 failures) would keep a draining or cut-off box in rotation for minutes; each box answers `GET /health`
  without a key (gateway/fleetside.py), the router's plain check.
* no `--worker-urls`: given a box that is down, 0.1.17 exits at start ("Timeout … waiting for hosts"), and
  `/add_worker` of a down box waits for its health (`--worker-startup-timeout-secs`, 600 s by default; 5 here).
  The supervisor adds the fleet file's boxes itself once each answers its health check (`reconcile`), after every
  start and every second: a box down at a restart joins when it is back.
* `--prometheus-host 127.0.0.1 --prometheus-port N`: one exporter per front (the default 29000 is shared).
* `--disable-circuit-breaker`: its default opens a worker's circuit after 10 failures and keeps it shut 60 s; a
  box draining answers 503 a few times before the health check takes it out, so each switched box stayed out of the
  rotation for a minute after it served again, and boxes switched in turn left none: the router refused every
  request itself (measured, docs/fleet.md#faults). The health checks (1 s) and the front's own watch
  (fleet/source.py) take a box out and put it back; the router's retries still send a 5xx elsewhere.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import httpx

from app.backend import oplog
from app.backend.fleet.fleetfile import FleetConfig, FleetError

COMPONENT = "fleet"
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0)  # a router that keeps dying is restarted ever more slowly
STOP_TIMEOUT_S = 5.0


def router_binary() -> str:
    """The `vllm-router` launcher of this Python's environment (the locks pin it), else the one on PATH."""
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.is_file():
        return str(beside)
    found = shutil.which("vllm-router")
    if found is None:
        raise FleetError("vllm-router is not installed in this environment (it is in requirements.lock: reinstall)")
    return found


def router_argv(cfg: FleetConfig) -> list[str]:
    return [router_binary(), "--host", "127.0.0.1", "--port", str(cfg.router_port),
            "--policy", cfg.policy,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(cfg.router_metrics_port),
            "--health-check-endpoint", "/health", "--health-check-interval-secs", str(cfg.health_interval_s),
            "--health-check-timeout-secs", "1", "--health-failure-threshold", "2", "--health-success-threshold", "1",
            "--worker-startup-check-interval", "1", "--worker-startup-timeout-secs", "5", "--disable-circuit-breaker",
            "--log-level", "warning"]


def box_healthy(url: str, timeout_s: float = 1.0) -> bool:
    try:
        return httpx.get(url.rstrip("/") + "/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def router_env() -> dict[str, str]:
    """What the router needs to run, nothing more (no tokens, no panel settings), as for the gateway's child."""
    from app.backend.config import env

    return {**env.inherited(("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "VIRTUAL_ENV")), "NO_COLOR": "1"}


def _die_with_parent() -> None:
    """In the router's child, before exec: SIGTERM when the thread that started it ends (the panel or `fleet
    serve` killed, even with SIGKILL): a router left behind would hold its ports and serve the old worker list
    (seen: the next front's router failed with "Address already in use")."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class RouterAdmin:
    """The router's admin routes, on loopback (the CLI's `fleet add|remove` and the supervisor use them)."""

    def __init__(self, cfg: FleetConfig, timeout_s: float = 10.0):
        self.base = cfg.router_url
        self._timeout = timeout_s

    def alive(self) -> bool:
        try:
            return httpx.get(self.base + "/workers", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    def workers(self) -> list[dict[str, object]]:
        """The router's workers with their health, [] when it does not answer."""
        try:
            r = httpx.get(self.base + "/workers", timeout=2.0)
            data = r.json()
        except (httpx.HTTPError, ValueError):
            return []
        ws = data.get("workers") if isinstance(data, dict) else None
        return [w for w in ws if isinstance(w, dict)] if isinstance(ws, list) else []

    def add(self, url: str) -> str:
        """Add a worker; "" when done, else the router's sentence."""
        return self._post(f"/add_worker?url={quote(url, safe='')}")

    def remove(self, url: str) -> str:
        return self._post(f"/remove_worker?url={quote(url, safe='')}")

    def _post(self, path: str) -> str:
        try:
            r = httpx.post(self.base + path, timeout=self._timeout)
        except httpx.HTTPError as exc:
            return f"the router does not answer at {self.base} ({type(exc).__name__})"
        return "" if r.status_code < 300 else f"the router answered {r.status_code}: {r.text.strip()[:200]}"


class RouterSupervisor:
    """Runs `vllm-router` as a child of the panel (its own process group; its log in `<state dir>/router.log`)
    and restarts it when it ends, reading the fleet file anew each time (boxes added while it was down come
    back with it). Every start, exit and restart goes to the operator's log."""

    def __init__(self, state_dir: Path, load: Callable[[], FleetConfig | None], who: str = oplog.PANEL):
        self._state_dir = Path(state_dir)
        self._load = load
        self._who = who
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.starts = 0
        self.last_exit: int | None = None

    @property
    def pid(self) -> int | None:
        p = self._proc
        return p.pid if p is not None and p.poll() is None else None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="fleet-router", daemon=True)
        self._thread.start()

    def _spawn(self) -> subprocess.Popen[bytes] | None:
        cfg = self._load()
        if cfg is None:
            return None
        argv = router_argv(cfg)
        log = open(self._state_dir / "router.log", "ab")
        try:
            # own session: a terminal's Ctrl-C reaches the panel, which stops the router in order
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=router_env(),
                                    preexec_fn=_die_with_parent)
        finally:
            log.close()
        self.starts += 1
        oplog.decision(COMPONENT, "router_started" if self.starts == 1 else "router_restarted", who=self._who,
                       pid=proc.pid, port=cfg.router_port, workers=len(cfg.boxes), policy=cfg.policy)
        return proc

    def reconcile(self) -> None:
        """The router's workers made the fleet file's boxes: a missing box that answers its health check is added,
        a worker no longer in the file removed (each change said once in the operator's log)."""
        cfg = self._load()
        admin = RouterAdmin(cfg, timeout_s=6.0) if cfg is not None else None
        if cfg is None or admin is None or not admin.alive():
            return
        have = {str(w.get("url", "")).rstrip("/") for w in admin.workers()}
        want = {b.url.rstrip("/"): b for b in cfg.boxes}
        for url, box in want.items():
            if url not in have and box_healthy(url):
                err = admin.add(url)
                if err:
                    oplog.decision(COMPONENT, "router_add_failed", who=oplog.PANEL, box=box.name, error=err)
                else:
                    oplog.decision(COMPONENT, "router_worker_added", who=oplog.PANEL, box=box.name, url=url)
        for url in have - set(want):
            err = admin.remove(url)
            oplog.decision(COMPONENT, "router_worker_removed", who=oplog.PANEL, url=url, error=err or "-")

    def _reconcile_loop(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.reconcile()
            except Exception as exc:  # a bug here must not end the supervision; said once per kind
                oplog.caught(COMPONENT, exc, "reconciling the router's workers", traceback=True)

    def _run(self) -> None:
        threading.Thread(target=self._reconcile_loop, name="fleet-router-reconcile", daemon=True).start()
        failures = 0
        while not self._stop.is_set():
            try:
                with self._lock:
                    self._proc = self._spawn() if not self._stop.is_set() else None
            except (OSError, FleetError) as exc:
                oplog.caught(COMPONENT, exc, "starting vllm-router")
                self._proc = None
            proc = self._proc
            if proc is None:
                self._stop.wait(RESTART_BACKOFF_S[-1])
                continue
            started = time.monotonic()
            code = proc.wait()
            self.last_exit = code
            if self._stop.is_set():
                return
            failures = 0 if time.monotonic() - started > 30 else failures + 1
            wait = RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)] if failures else 0.0
            oplog.decision(COMPONENT, "router_exited", who=oplog.OUTSIDE, pid=proc.pid, code=code,
                           restart_in_s=wait)
            self._stop.wait(wait)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
            oplog.decision(COMPONENT, "router_stopped", who=self._who, pid=proc.pid)
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_S)
