"""SimEngineServer: the SIMULATED vLLM-Moet engine as an in-process HTTP server (stdlib only).

Lifecycle: created -> loading (listening, /health 503, boot lines) -> ready (/health 200) ->
stopped | dead (fatal error: listening socket closed, `exit_code` set, `wait()` returns it).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from http.server import ThreadingHTTPServer
from socketserver import ThreadingUnixStreamServer
from collections.abc import Callable

from .boot import FATAL_TRACEBACK, BootSequence, SimExit, Stopped
from .config import SimEngineConfig
from .delta import DeltaSim, plan_tier
from .engine import EngineCore, SimRequest
from .handler import make_handler
from .logsink import LogSink, LogTarget
from .metrics import Metrics
from .quality import degrade, needle_max_tokens, quality_tier


@dataclass
class SimStats:
    """Counters a test (or the demo) can read; `stats` returns a copy."""

    requests: int = 0  # generation requests accepted
    completed: int = 0  # finished with stop/length
    aborted: int = 0  # client disconnected mid-generation
    errors: int = 0  # answered with a 4xx
    tokens: int = 0
    last_params: dict[str, object] = field(default_factory=dict)


class _Http(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: object) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return  # a client hanging up between requests is normal, not an error worth a traceback
        super().handle_error(request, client_address)


class _UnixHttp(ThreadingUnixStreamServer):
    """The same server on a unix socket (vLLM's --uds): no TCP port at all (docs/engine.md)."""

    daemon_threads = True

    def server_bind(self) -> None:
        path = str(self.server_address)
        if os.path.exists(path) and not _answers(path):  # a socket left by a dead engine (vLLM's bind would fail;
            os.unlink(path)  # the panel removes it before a start, docs/engine.md)
        super().server_bind()
        # the directory (0700, the panel's) is the gate; the socket itself lets the panel's user in when the
        # container runs as another user
        os.chmod(path, 0o666)

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket], client_address: object) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


def _answers(path: str) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(path) == 0


class SimEngineServer:
    def __init__(self, config: SimEngineConfig, log: LogTarget = None):
        self.config = config
        pid = config.pid or os.getpid()
        self.log = LogSink(log, engine_pid=pid, api_pid=pid)
        self.state = "created"
        self.exit_code: int | None = None
        self.exit_reason = ""
        self._stats = SimStats()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._exited = threading.Event()
        self.tier_plan = plan_tier(config)
        self.delta = DeltaSim(self.tier_plan, self.log, config.seed)
        self.metrics = Metrics(config.served_name, kv_capacity_tokens=int(config.max_model_len * 1.1))
        self.engine = EngineCore(config.decode_tok_s, config.prefill_tok_s, config.max_num_seqs, self.metrics,
                                 on_step=self.delta.on_step, on_token=self._on_token)
        self._httpd: _Http | _UnixHttp | None = None
        self._threads: list[threading.Thread] = []
        self._first_request_id = ""
        self.started_at = time.time()
        self.quality_tier = quality_tier(config)
        self.needle_max_tokens = needle_max_tokens(config)

    # --- public API -------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The TCP port listened on (0 on a unix socket)."""
        if self.config.uds:
            return 0
        return int(self._httpd.server_address[1]) if isinstance(self._httpd, _Http) else self.config.port

    @property
    def base_url(self) -> str:
        """Its address in the panel's notation (recipe/endpoint.py): `unix:/…` on a socket, else http://host:port."""
        if self.config.uds:
            return "unix:" + self.config.uds
        host = self.config.host if self.config.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port}"

    @property
    def stats(self) -> SimStats:
        with self._lock:
            return replace(self._stats, last_params=dict(self._stats.last_params))

    @property
    def ready(self) -> bool:
        return self.state == "ready"

    def start(self) -> "SimEngineServer":
        """Bind and listen now (answering 503 while loading), boot in the background; returns at once."""
        if self.state != "created":
            raise RuntimeError(f"SimEngineServer already {self.state}")
        handler = make_handler(self)
        httpd: _Http | _UnixHttp
        if self.config.uds:  # vLLM's --uds: host and port are ignored
            httpd = _UnixHttp(self.config.uds, handler)
        else:
            httpd = _Http((self.config.host, self.config.port), handler)
        self._httpd = httpd
        self.state = "loading"
        self._spawn(lambda: httpd.serve_forever(poll_interval=0.05), "sim-http")
        self._spawn(self._boot, "sim-boot")
        return self

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.state == "loading":
            self._exited.wait(0.02)
        return self.state == "ready"

    def wait(self, timeout: float | None = None) -> int | None:
        """Block until the simulated process would have exited; its exit code (None on timeout)."""
        self._exited.wait(timeout)
        return self.exit_code

    def stop(self) -> None:
        """Graceful shutdown (like SIGTERM on the real server)."""
        if self.state in ("stopped", "dead", "created"):
            self.state = "stopped" if self.state == "created" else self.state
            self._exited.set()
            return
        was_ready = self.state == "ready"
        self.state = "stopped"
        self._stop.set()
        self.engine.stop()
        if was_ready:
            self.log.uvicorn("Shutting down")
            self.log.uvicorn("Waiting for application shutdown.")
            self.log.uvicorn("Application shutdown complete.")
            self.log.uvicorn(f"Finished server process [{self.log.api_pid}]")
        self._close_http()
        self._finish(0, "stopped")

    # --- internals used by the handler -------------------------------------------------------------

    def record_request(self, params: dict[str, object]) -> None:
        with self._lock:
            self._stats.requests += 1
            self._stats.last_params = params

    def record_end(self, req: SimRequest, aborted: bool) -> None:
        with self._lock:
            self._stats.tokens += req.produced
            if aborted:
                self._stats.aborted += 1
            else:
                self._stats.completed += 1
        if aborted:
            self.metrics.finish("abort", time.monotonic() - req.arrived)
            self.log.api("async_llm.py:418", f"Aborted request {req.request_id}.")

    def record_error(self) -> None:
        with self._lock:
            self._stats.errors += 1

    def submit(self, req: SimRequest) -> None:
        if not self._first_request_id:
            self._first_request_id = req.request_id
        self.engine.submit(req)

    # --- background work -----------------------------------------------------------------------------

    def _spawn(self, target: Callable[[], object], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def _boot(self) -> None:
        seq = BootSequence(self.config, self.log, self.tier_plan, sleep=self._stop.wait, clock=time.monotonic,
                           port=self.port, on_ready=self._become_ready)
        try:
            seq.run()
        except Stopped:
            return
        except SimExit as exc:
            self._die(exc.code, exc.reason)
            return
        if not self._stop.is_set():
            self._spawn(self._stats_logger, "sim-stats")

    def _become_ready(self) -> None:
        if self._stop.is_set():
            return
        self.engine.start()
        self.state = "ready"
        if self.config.fail == "hang_after_ready":
            self.wedge()
        if (slow := degrade(self.config)) is not None:
            self._spawn(lambda: self._degrade_after(*slow), "sim-degrade")

    def _degrade_after(self, factor: float, after_s: float) -> None:
        if self._stop.wait(after_s):
            return
        rate = self.config.decode_tok_s * factor
        self.engine.set_decode_rate(rate)
        self.log.api("sim_degrade.py:1", f"SIMULATED degraded mode: decode slowed to {rate:.1f} tok/s "
                     f"({factor:g} x {self.config.decode_tok_s:g}), as a throttling or slow-link box would", "WARNING")

    def _stats_logger(self) -> None:
        """vLLM's periodic `Engine 000: Avg prompt throughput ...` line, while there is (or just was) traffic."""
        interval = self.config.stats_interval_s
        last = (self.metrics.prompt_tokens, self.metrics.generation_tokens)
        was_busy = False
        while not self._stop.wait(interval):
            now = (self.metrics.prompt_tokens, self.metrics.generation_tokens)
            running, waiting = self.engine.load()
            busy = now != last or running > 0 or waiting > 0
            if busy or was_busy:
                kv = 100.0 * min(1.0, self.metrics.kv_tokens / self.metrics.kv_capacity_tokens)
                self.log.api("loggers.py:123", "Engine 000: Avg prompt throughput: %.1f tokens/s, Avg generation "
                             "throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: "
                             "%.1f%%, Prefix cache hit rate: %.1f%%" % ((now[0] - last[0]) / interval,
                                                                       (now[1] - last[1]) / interval,
                                                                       running, waiting, kv, 0.0))
            last, was_busy = now, busy

    def _on_token(self, req: SimRequest) -> None:
        if (self.config.fail == "crash_mid_generation" and req.request_id == self._first_request_id
                and req.produced >= self.config.crash_after_tokens):
            self._crash()
        if (self.config.fail == "hang_mid_generation" and req.request_id == self._first_request_id
                and req.produced >= self.config.crash_after_tokens):
            self.engine.hung = True  # requests stay running, no more tokens, /health still 200

    def wedge(self) -> None:
        """hang_after_ready / SIGUSR1: the engine wedges while /health keeps answering 200 (vllm#39863)."""
        self.engine.wedge()
        self.log.engine("core.py:1", "SIMULATED hang: the engine core stopped scheduling (/health stays 200)",
                        "WARNING")

    def crash_now(self) -> None:
        """SIGUSR2: a fatal engine-core error while serving (the soak's "simulated crash")."""
        if self.state == "ready":
            self._crash()

    def _crash(self) -> None:
        self.log.engine("core.py:933", "EngineCore encountered a fatal error.", "ERROR")
        self.log.engine_plain(FATAL_TRACEBACK)
        self.log.api("async_llm.py:480", "AsyncLLM output_handler failed.", "ERROR")
        self.log.plain(f"(APIServer pid={self.log.api_pid}) vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
                       "encountered an issue. See stack trace (above) for the root cause.", stderr=False)
        self.state = "dead"  # /health answers 503 until the process is gone, like vLLM's EngineDeadError
        self.engine.kill("EngineCore encountered a fatal error.")
        threading.Thread(target=self._die, args=(1, "EngineCore encountered a fatal error", True), daemon=True).start()

    def _die(self, code: int, reason: str, was_serving: bool = False) -> None:
        self.state = "dead"
        self._stop.set()
        self.engine.kill(reason)
        if was_serving and code != 137:  # uvicorn only shuts down if it ran; SIGKILL prints nothing
            self.log.uvicorn("Shutting down")
            self.log.uvicorn(f"Finished server process [{self.log.api_pid}]")
        self._close_http()
        self._finish(code, reason)

    def _close_http(self) -> None:
        httpd = self._httpd
        if httpd is not None:
            if threading.current_thread().name != "sim-http":
                httpd.shutdown()
            httpd.server_close()

    def _finish(self, code: int, reason: str) -> None:
        if self.exit_code is None:
            self.exit_code, self.exit_reason = code, reason
        self._exited.set()
