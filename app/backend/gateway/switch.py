"""The gateway as a panel service: one switch (off → on → off), its state, the keys and the activity.

The panel's Access tab calls this. The gateway runs as a **process of its own** — `moet-panel gateway
--status-from-stdin`, the same code as the terminal command — not on a thread of the panel: a thread would
share the panel's GIL with Gradio and the telemetry hub, putting the page work in every token's path
(issue 31, docs/gateway.md "How the panel runs it"). The panel pushes the engine's status to it, one JSON
line on its stdin at start and on every change event of the engine reconciler; the child exits on EOF, so it
never outlives the panel. Keys are the same SQLite file `moet-panel keys` manages; the child opens it
itself (revocation from here reaches it as from any other process: within a second).

The switch's position is remembered in the state dir (`gateway.json`): a panel restarted with the gateway
on starts it again, with no click.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import IO

import app as _app_package
from app.backend import oplog
from app.backend.config import env
from app.backend.contracts import CHAT_MAX_TOKENS, ChatRoute, SnapshotFn
from app.backend.files.jsonstore import JsonStore
from app.backend.gateway.caps import CapsError, GatewayCaps, check_caps
from app.backend.gateway.keys import ActivityRecord, CreatedKey, KeyInfo, KeyStore, KeyStoreError, PANEL_CHAT_KEY, hash_key
from app.backend.gateway.engine_status import EngineStatus, SnapshotSource
from app.backend.gateway.routing import BoxSource
from app.backend.gateway.proxy import Limits
from app.backend.gateway.server import GatewayConfig

DESIRED_FILE = "gateway.json"
START_TIMEOUT_S = 30.0  # a Python start on a loaded box; the child answers in about a second when idle
STOP_TIMEOUT_S = 10.0
OFF_MESSAGE = "off: other machines cannot reach the model"
ON_MESSAGE = "serving: clients need a key (Authorization: Bearer …)"
RESTORED_NOTE = " — restored after the panel restarted"
# The Chat tab's own key (docs/chat.md "Taking turns"): made afresh when the gateway starts, its value kept in the
# panel's memory only; listed with the others, so chat shows in the usage and /metrics by this name.
CHAT_KEY_NAME = PANEL_CHAT_KEY

# `subscribe(callback) -> unsubscribe`: the engine controller's `on_change` (a thread of its own per listener)
Subscribe = Callable[[Callable[[object], None]], Callable[[], None]]


class GatewayState(str, Enum):
    OFF = "off"
    STARTING = "starting"
    ON = "on"
    FAILED = "failed"


@dataclass(frozen=True)
class GatewaySnapshot:
    state: GatewayState
    url: str = ""  # where clients connect (when on)
    message: str = ""  # why it failed, or what it is doing
    engine_ready: bool = False
    engine_reason: str = ""
    pid: int | None = None  # the gateway process (when on)
    restored: bool = False  # started by the panel's start-up from the remembered switch, not by a click
    # the fair queue (docs/gateway.md "The fair queue"), as the child last reported: waiting now, and the mean
    # wait of the requests that waited so far (None: none yet)
    queue_length: int = 0
    queue_wait_mean_s: float | None = None
    # a box of several GPUs: answers in flight per GPU, and the GPUs the gateway can send to now
    in_flight_gpu: tuple[tuple[int, int], ...] = ()
    serving_gpus: tuple[int, ...] = ()
    # the caps in force (docs/gateway.md#caps): a request's max_tokens for keys without their own, a key's hold on
    # the engine while others wait, a client's silence before its answer is cut
    max_tokens: int = 0
    max_hold_s: float = 0.0
    stall_s: float = 0.0


@dataclass(frozen=True)
class GatewayView:
    snapshot: GatewaySnapshot
    keys: tuple[KeyInfo, ...]
    activity: tuple[ActivityRecord, ...]


@dataclass(frozen=True)
class DesiredGateway:
    """The switch as the user left it: restored when the panel starts (reboot, crash, systemd restart); with the
    owner's caps (caps.py; None: the recipe's default)."""

    on: bool = False
    port: int | None = None
    max_tokens: int | None = None
    max_hold_s: float | None = None


def _desired_store(state_dir: Path) -> JsonStore[DesiredGateway]:
    return JsonStore(state_dir / DESIRED_FILE, DesiredGateway)


def load_desired(state_dir: Path) -> DesiredGateway:
    # none yet, or unreadable: off (never expose the model on a guess)
    return _desired_store(state_dir).read() or DesiredGateway()


def save_desired(state_dir: Path, desired: DesiredGateway) -> None:
    _desired_store(state_dir).write(desired)


def child_argv(cfg: GatewayConfig, state_dir: Path) -> list[str]:
    """`moet-panel gateway` as the panel runs it: settings on argv (nothing secret: keys stay in the store).
    The limits the CLI takes are carried; the other `Limits` fields (timeouts, the connection cap) have no
    panel setting and stay at their defaults on both sides."""
    lim = cfg.limits
    argv = [sys.executable, "-m", "app.cli.main", "gateway", "--status-from-stdin", "--state-dir", str(state_dir),
            "--host", cfg.host, "--port", str(cfg.port), "--max-concurrent", str(lim.max_concurrent),
            "--rate", repr(lim.rate_per_min), "--max-body-mb", repr(lim.max_body_bytes / 2**20),
            "--max-tokens", str(lim.max_tokens), "--max-hold-s", repr(lim.max_hold_s),
            "--engine-slots", str(lim.engine_slots), "--stall-s", repr(lim.stall_s),
            "--per-source", str(lim.max_conn_per_source)]
    if lim.capture_bodies:
        argv += ["--capture-bodies", str(lim.capture_cap_bytes)]
    if cfg.tls_cert is not None:
        argv += ["--tls-cert", str(cfg.tls_cert)]
    if cfg.tls_key is not None:
        argv += ["--tls-key", str(cfg.tls_key)]
    if cfg.insecure_http:
        argv.append("--insecure-http")
    return argv


def child_env() -> dict[str, str]:
    """What the child needs to run Python, nothing more: no tokens, no notify URLs, no panel settings (its
    own settings come on argv)."""
    return env.inherited(("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "PYTHONPATH", "VIRTUAL_ENV",
                          "PYTHONDONTWRITEBYTECODE"))


class GatewayProcess:
    """One `moet-panel gateway --status-from-stdin` child: spawn, wait until it listens, push statuses, stop."""

    def __init__(self, cfg: GatewayConfig, state_dir: Path):
        self.proc = subprocess.Popen(
            child_argv(cfg, state_dir), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=child_env(), cwd=str(Path(_app_package.__file__).resolve().parents[1]),
            start_new_session=True)  # a terminal's Ctrl-C reaches the panel, which stops its child itself
        self.pid = self.proc.pid
        self.url = ""
        self.port = 0
        self._listening = threading.Event()
        self.in_flight = 0  # the child's answers in flight, as it last reported (a drain waits for 0)
        self.in_flight_gpu: dict[int, int] = {}  # the same per GPU, on a box of several
        self.metrics: dict[str, object] | None = None  # its latest figures (gwmetrics.py)
        self.queue_ahead: dict[str, int] = {}  # waiting key hash -> requests that get the GPU before it
        self._stderr: deque[str] = deque(maxlen=20)
        self._write_lock = threading.Lock()
        self._readers = [threading.Thread(target=self._read_stdout, name="gateway-child-out", daemon=True),
                         threading.Thread(target=self._read_stderr, name="gateway-child-err", daemon=True)]
        for t in self._readers:
            t.start()

    def _read_stdout(self) -> None:
        out: IO[bytes] | None = self.proc.stdout
        if out is None:
            return
        for raw in iter(out.readline, b""):
            try:
                msg = json.loads(raw)
            except ValueError as exc:  # not one of its report lines: skipped
                oplog.caught("gateway", exc, "reading a line of the gateway process's stdout", level=logging.DEBUG)
                continue
            if not isinstance(msg, dict):
                continue
            if "listening" in msg:
                self.url, self.port = str(msg["listening"]), int(msg.get("port") or 0)
                self._listening.set()
            if isinstance(msg.get("in_flight"), int):
                self.in_flight = max(0, msg["in_flight"])
            by_gpu = msg.get("in_flight_gpu")
            if isinstance(by_gpu, dict):
                self.in_flight_gpu = {int(k): max(0, v) for k, v in by_gpu.items()
                                      if isinstance(k, str) and k.isdigit() and isinstance(v, int)}
            if isinstance(msg.get("metrics"), dict):
                self.metrics = msg["metrics"]
            ahead = msg.get("queue_ahead")
            if isinstance(ahead, dict):
                self.queue_ahead = {k: v for k, v in ahead.items() if isinstance(k, str) and isinstance(v, int)}
        self.in_flight = 0  # the child is gone: nothing of it is in flight
        self.in_flight_gpu = {}
        self.queue_ahead = {}

    def _read_stderr(self) -> None:
        err: IO[bytes] | None = self.proc.stderr
        if err is None:
            return
        for raw in iter(err.readline, b""):
            line = raw.decode("utf-8", "replace").strip()
            if line:
                self._stderr.append(line)

    def wait_listening(self, timeout: float) -> bool:
        """True once the child listens; False when it exited first or the timeout passed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._listening.wait(0.05):
                return True
            if self.proc.poll() is not None:
                return self._listening.is_set()
        return self._listening.is_set()

    def send(self, line: EngineStatus | GatewayCaps) -> bool:
        """Write one status or caps line; False when the child is gone (a broken pipe is its exit, seen elsewhere)."""
        stdin = self.proc.stdin
        if stdin is None:
            return False
        with self._write_lock:
            try:
                stdin.write(line.to_line())
                stdin.flush()
                return True
            except (OSError, ValueError) as exc:  # BrokenPipeError, or closed by stop()
                if self.proc.poll() is None:  # alive but not reading: worth a line (a dead child is seen by _watch)
                    oplog.caught("gateway", exc, f"sending {type(line).__name__} to the gateway process", pid=self.pid)
                return False

    def reason(self) -> str:
        """Why it ended, in the child's own words (its last error line), with the exit status."""
        for t in self._readers:
            t.join(2)  # the last lines are in before they are read
        code = self.proc.returncode
        lines = [ln for ln in self._stderr if not ln.startswith(("Traceback", "File ", "INFO:"))]
        said = lines[-1] if lines else ""
        said = said.removeprefix("moet-panel: ")
        how = (f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}")
        return f"{said} ({how})" if said else how

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """EOF on its stdin (its normal way out: listener closed at once, running answers get a grace), then
        SIGTERM, then SIGKILL."""
        with self._write_lock:
            try:
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            except OSError:
                pass
        for action in (None, self.proc.terminate, self.proc.kill):
            if action is not None:
                try:
                    action()
                except OSError as exc:  # gone in between: nothing left to stop
                    oplog.caught("gateway", exc, "stopping the gateway process", level=logging.DEBUG, pid=self.pid)
            try:
                self.proc.wait(timeout)
                break
            except subprocess.TimeoutExpired:
                continue
        for pipe in (self.proc.stdout, self.proc.stderr):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass


def _whole(n: float | None) -> int | None:
    """A page's number as the key store takes it (4096.0 is 4096); the store checks the range."""
    if n is None or isinstance(n, int):
        return n
    if not n.is_integer():  # 12.5, inf, nan
        raise KeyStoreError(f"max tokens {n:g}: expected a whole number of tokens (0: the gateway's cap)")
    return int(n)


class GatewayService:
    def __init__(self, state_dir: Path, config: GatewayConfig, snapshot_fn: SnapshotFn, engine_base_url: str,
                 subscribe: Subscribe | None = None, slots_for: Callable[[str], int] | None = None,
                 source: SnapshotSource | BoxSource | None = None, subscribe_more: tuple[Subscribe, ...] = ()):
        """`source`: the box's status (routing.box_source, the one source `moet-panel gateway` builds for itself
        too); `subscribe_more`: a box of several GPUs (docs/gateway.md "Several GPUs: routing"): pushed on a change
        of any GPU's controller."""
        self.keys = KeyStore(state_dir)
        self.state_dir = state_dir
        self.config = config
        self._source: SnapshotSource | BoxSource = source or SnapshotSource(snapshot_fn, engine_base_url, slots_for)
        self._lock = threading.Lock()  # start/stop/close, one at a time
        self._child: GatewayProcess | None = None
        self._sent: EngineStatus | None = None
        self._closed = False
        self._snap = GatewaySnapshot(GatewayState.OFF, url=config.url(), message=OFF_MESSAGE)
        self._view: GatewayView | None = None
        self._view_at = 0.0
        self._view_lock = threading.Lock()
        self._last_metrics: dict[str, object] | None = None  # counters survive a restart of the child in the export
        self._chat_key: str | None = None  # the panel's own key for the Chat tab (CHAT_KEY_NAME), memory only
        self._desired: DesiredGateway | None = None  # gateway.json as last read or written here
        self._chat_lock = threading.Lock()
        # every engine change reaches the child at once (no polling); the listener has a thread of its own
        self._unsubscribe = subscribe(lambda _ev: self.push()) if subscribe is not None else None
        self._unsubscribe_more = [sub(lambda _ev: self.push()) for sub in subscribe_more]

    # -- state ---------------------------------------------------------------------------------------
    def snapshot(self) -> GatewaySnapshot:
        st = self._source.status()
        figures, _ = self.metrics()
        qlen, qmean = 0, None
        if figures is not None:
            length = figures.get("queue_length")
            qlen = length if isinstance(length, int) else 0
            wait = figures.get("queue_wait")
            if isinstance(wait, dict) and isinstance(wait.get("count"), int) and wait["count"] > 0:
                qmean = float(wait.get("sum") or 0.0) / wait["count"]
        child = self._child
        by_gpu = tuple(sorted(child.in_flight_gpu.items())) if child is not None else ()
        lim = self.limits()
        return replace(self._snap, engine_ready=st.accepts if st.engines else st.ready, engine_reason=st.reason,
                       queue_length=qlen, queue_wait_mean_s=qmean, in_flight_gpu=by_gpu,
                       serving_gpus=tuple(e.gpu for e in st.engines if e.accepts),
                       max_tokens=lim.max_tokens, max_hold_s=lim.max_hold_s, stall_s=lim.stall_s)

    def limits(self) -> Limits:
        """The limits in force: the recipe's (the panel's config), with the owner's caps over them."""
        desired = self.desired()
        return replace(self.config.limits, max_tokens=desired.max_tokens or self.config.limits.max_tokens,
                       max_hold_s=desired.max_hold_s or self.config.limits.max_hold_s)

    def caps(self) -> GatewayCaps:
        lim = self.limits()
        return GatewayCaps(lim.max_tokens, lim.max_hold_s)

    def answers_in_flight(self) -> int:
        """Answers the gateway process is serving now (contracts.AnswerCounter: a stop or switch drains them)."""
        child = self._child
        return child.in_flight if child is not None and child.proc.poll() is None else 0

    def answers_in_flight_on(self, gpu: int) -> int:
        """Answers the gateway process serves on that GPU's engine now (a box of several: that engine's drain)."""
        child = self._child
        return child.in_flight_gpu.get(gpu, 0) if child is not None and child.proc.poll() is None else 0

    def metrics(self) -> tuple[dict[str, object] | None, bool]:
        """(the child's latest figures, whether it serves now), for the panel's /metrics (gwmetrics.families)."""
        child = self._child
        if child is None:
            return self._last_metrics, False
        if child.metrics is not None:
            self._last_metrics = child.metrics
        return self._last_metrics, child.proc.poll() is None and self._snap.state is GatewayState.ON

    @property
    def pid(self) -> int | None:
        child = self._child
        return child.pid if child is not None else None

    def push(self) -> None:
        """Send the engine's status to the child when it changed (called on every engine change event)."""
        child = self._child
        if child is None:
            return
        st = self._source.status()
        if st != self._sent and child.send(st):
            self._sent = st

    def start(self, port: int | None = None, *, restored: bool = False, who: str = oplog.PANEL) -> GatewaySnapshot:
        """Start serving (idempotent); a refused configuration leaves it off with the reason. A click records
        the switch as on (restored at the next panel start); `restored` is that start-up's own call."""
        with self._lock:
            if self._closed:
                return self.snapshot()
            if self._child is not None and self._child.proc.poll() is None:
                return self.snapshot()
            cfg = replace(self.config, limits=self.limits())
            cfg = cfg if port is None else replace(cfg, port=port)
            self._snap = GatewaySnapshot(GatewayState.STARTING, url=cfg.url(), message="starting", restored=restored)
            self._fresh_chat_key()  # before the child loads the keys: the first chat is never refused
            try:
                child = GatewayProcess(cfg, self.state_dir)
            except OSError as exc:
                oplog.caught("gateway", exc, "spawning the gateway process")
                self._snap = GatewaySnapshot(GatewayState.FAILED, url=cfg.url(), message=f"cannot start the gateway "
                                             f"process: {exc}", restored=restored)
                return self.snapshot()
            self._child, self._sent = child, None
            self.push()  # the first status, before it serves a request
            if not child.wait_listening(START_TIMEOUT_S):
                self._child = None
                child.stop(2)
                self._snap = GatewaySnapshot(GatewayState.FAILED, url=cfg.url(), message=child.reason()
                                             if child.proc.returncode is not None else "the gateway did not start "
                                             f"within {START_TIMEOUT_S:.0f} s", restored=restored)
                oplog.decision("gateway", "start_failed", who=who, reason=self._snap.message)
                return self.snapshot()
            self.push()  # a change between the first line and now
            self._snap = GatewaySnapshot(GatewayState.ON, url=child.url, pid=child.pid, restored=restored,
                                         message=ON_MESSAGE + (RESTORED_NOTE if restored else ""))
            oplog.decision("gateway", "start", who=who, url=child.url, pid=child.pid, restored=restored)
            if not restored:
                self._save(replace(self.desired(), on=True, port=cfg.port))
            threading.Thread(target=self._watch, args=(child,), name="gateway-child-watch", daemon=True).start()
            return self.snapshot()

    def _watch(self, child: GatewayProcess) -> None:
        """The child ending while it should serve: FAILED with its own reason (the Access tab shows it)."""
        child.proc.wait()
        with self._lock:
            if self._child is not child:
                return  # stopped on purpose
            self._child = None
            self._snap = GatewaySnapshot(GatewayState.FAILED, url=self._snap.url,
                                         message=f"the gateway stopped: {child.reason()}")
            oplog.decision("gateway", "died", who=oplog.OUTSIDE, reason=self._snap.message)

    def stop(self, who: str = oplog.PANEL) -> GatewaySnapshot:
        """Switch off (a click): the child stops and the switch is recorded as off."""
        snap = self._halt()
        oplog.decision("gateway", "stop", who=who)
        self._save(replace(self.desired(), on=False))
        return snap

    def _halt(self) -> GatewaySnapshot:
        with self._lock:
            child, self._child = self._child, None
            if child is not None:
                child.stop()
                self._drop_chat_key()
            self._snap = GatewaySnapshot(GatewayState.OFF, url=self.config.url(), message=OFF_MESSAGE)
            return self.snapshot()

    # -- the Chat tab's turn (contracts.ChatGate) ----------------------------------------------------
    def _fresh_chat_key(self) -> str | None:
        """Revoke the panel's chat key of a previous run (its value is gone with that process) and make a new one;
        None when the key store refuses (the chat then goes to the engine directly, said in the operator's log)."""
        with self._chat_lock:
            try:
                self.keys.revoke(CHAT_KEY_NAME, who=oplog.PANEL)
                # the chat's own cap, not the shared default: a chat may ask for CHAT_MAX_TOKENS
                self._chat_key = self.keys.create(CHAT_KEY_NAME, who=oplog.PANEL, panel_own=True,
                                                  max_tokens=CHAT_MAX_TOKENS).key
            except (KeyStoreError, OSError, sqlite3.Error) as exc:
                oplog.caught("gateway", exc, "making the Chat tab's key")
                self._chat_key = None
            return self._chat_key

    def _drop_chat_key(self) -> None:
        """The gateway stopped: its chat key goes too (its value dies with this process; none stays active)."""
        with self._chat_lock:
            if self._chat_key is None:
                return
            self._chat_key = None
            try:
                self.keys.revoke(CHAT_KEY_NAME, who=oplog.PANEL)
            except (KeyStoreError, OSError, sqlite3.Error) as exc:  # revoked at the next start anyway
                oplog.caught("gateway", exc, "revoking the Chat tab's key")

    def chat_route(self) -> ChatRoute | None:
        """The Chat tab's way to the engine while the gateway serves: its address on this box and the panel's key
        (made again when someone revoked it). None while off: the chat then talks to the engine directly."""
        child = self._child
        if child is None or child.proc.poll() is not None or self._snap.state is not GatewayState.ON or not child.port:
            return None
        key = self._chat_key
        if key is None or not self.keys.still_active(hash_key(key)):
            key = self._fresh_chat_key()
            if key is None:
                return None
        cfg = self.config
        host = cfg.host
        if host in ("", "0.0.0.0"):
            host = "127.0.0.1"  # a wildcard listen is reached on loopback
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        # TLS: the owner's certificate names the box as others reach it, not as the panel does; the connection is
        # to this box's own address (it never leaves the host), so it is not checked
        return ChatRoute(f"{'https' if cfg.tls else 'http'}://{host}:{child.port}", key, verify=not cfg.tls)

    def waiting_ahead(self, key: str) -> int | None:
        """The requests that get the GPU before this key's waiting one, as the child last reported (about every
        0.2 s); None when it waits for none."""
        child = self._child
        return child.queue_ahead.get(hash_key(key)) if child is not None else None

    # -- the remembered switch -----------------------------------------------------------------------
    def desired(self) -> DesiredGateway:
        """The remembered switch and caps: read once, then kept as this service (their one writer) writes them."""
        if self._desired is None:
            self._desired = load_desired(self.state_dir)
        return self._desired

    def _save(self, desired: DesiredGateway) -> None:
        self._desired = desired
        try:
            save_desired(self.state_dir, desired)
        except OSError as exc:  # a full disk: the gateway still runs; only a restart would forget the switch
            oplog.caught("gateway", exc, "saving the gateway switch", on=desired.on)

    def restore(self) -> threading.Thread | None:
        """At panel start-up: the switch was left on → start again, on a thread (the panel does not wait)."""
        desired = self.desired()
        if not desired.on:
            return None
        self._snap = GatewaySnapshot(GatewayState.STARTING, url=self.config.url(desired.port),
                                     message="starting: restoring the gateway after the panel restarted", restored=True)
        t = threading.Thread(target=self.start, args=(desired.port,), kwargs={"restored": True},
                             name="gateway-restore", daemon=True)
        t.start()
        return t

    # -- keys and activity ---------------------------------------------------------------------------
    def create_key(self, name: str, expires_days: float | None = None, who: str = oplog.PANEL,
                   max_tokens: float | None = None) -> CreatedKey:
        """A new key (KeyStoreError says why not); `max_tokens` its own cap a request (None: the gateway's)."""
        created = self.keys.create(name, expires_days, who=who, max_tokens=_whole(max_tokens))
        self._invalidate()
        return created

    def set_key_max_tokens(self, name: str, max_tokens: float | None, who: str = oplog.PANEL) -> bool:
        """A key's own cap (None: the gateway's again); the running gateway applies it within a second (it reads
        the key store). False: no active key of that name; KeyStoreError: not a cap."""
        ok = self.keys.set_max_tokens(name, _whole(max_tokens), who=who)
        self._invalidate()
        return ok

    def set_caps(self, max_tokens: float | None, max_hold_s: float | None, who: str = oplog.PANEL) -> GatewayCaps:
        """The owner's caps for keys without their own (None: the recipe's default), remembered in gateway.json and
        sent to a running gateway at once: the next request meets them, no answer is cut. Raises CapsError."""
        tokens, hold = check_caps(max_tokens, max_hold_s, self.config.limits.context_tokens)
        with self._lock:  # not while a start reads the desired caps for its argv
            desired = replace(self.desired(), max_tokens=tokens, max_hold_s=hold)
            try:
                save_desired(self.state_dir, desired)
            except OSError as exc:
                oplog.caught("gateway", exc, "saving the gateway's caps")
                raise CapsError(f"cannot save the caps in {self.state_dir / DESIRED_FILE}: {exc}") from None
            self._desired = desired
            caps = self.caps()
            child = self._child
            sent = child is not None and child.send(caps)
        oplog.decision("gateway", "caps", who=who, max_tokens=caps.max_tokens, max_hold_s=caps.max_hold_s,
                       default_max_tokens=tokens is None, default_hold=hold is None, sent_to_gateway=sent)
        return caps

    def revoke_key(self, name: str, who: str = oplog.PANEL) -> bool:
        ok = self.keys.revoke(name, who=who)
        self._invalidate()
        return ok

    def list_keys(self) -> list[KeyInfo]:
        return self.keys.infos()

    def activity(self, limit: int = 50) -> list[ActivityRecord]:
        return self.keys.activity(limit)

    def view(self, max_age_s: float = 2.0) -> GatewayView:
        """Snapshot, keys with usage and recent activity for a page timer: read from the file at most every
        `max_age_s` (a key created or revoked here refreshes it at once)."""
        now = time.monotonic()
        with self._view_lock:
            cached = self._view
            if cached is not None and now - self._view_at < max_age_s:
                return replace(cached, snapshot=self.snapshot())
        view = GatewayView(self.snapshot(), tuple(self.keys.infos()), tuple(self.keys.activity(50)))
        with self._view_lock:
            self._view, self._view_at = view, now
        return view

    def _invalidate(self) -> None:
        with self._view_lock:
            self._view = None

    def close(self) -> None:
        """The panel closes: the child stops, the switch stays as the user left it (restored next start)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
        for unsub in self._unsubscribe_more:
            unsub()
        with self._lock:
            self._closed = True  # a restore still starting gives up
        self._halt()
        self.keys.close()
