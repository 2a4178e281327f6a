"""`python3 -m simengine [vLLM serve args]`: run the SIMULATED engine in the foreground.

Exit codes mirror the real server: 0 after SIGTERM/SIGINT, 1 when the engine fails (OOM at load, fatal
error mid-generation), and death by SIGKILL (137 in Docker) for the host-OOM failure mode.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from .config import config_from_env_and_args
from .server import SimEngineServer


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = config_from_env_and_args(sys.argv[1:] if argv is None else argv, os.environ)
    except (ValueError, SystemExit) as exc:
        print(f"simengine: bad configuration: {exc}", file=sys.stderr)
        return 2
    # Loopback unless asked otherwise, in a container too (issue 31, docs/gateway.md): the panel runs engines
    # with --network host, so 0.0.0.0 would open the engine to the box's network. An explicit --host wins
    # over MOET_SIM_HOST (the panel always passes --host 127.0.0.1).
    if os.environ.get("MOET_SIM_HOST") and "--host" not in (sys.argv[1:] if argv is None else argv):
        cfg.host = os.environ["MOET_SIM_HOST"]
    server = SimEngineServer(cfg)
    stop_requested = threading.Event()

    def on_signal(_signum: int, _frame: object) -> None:
        stop_requested.set()
        threading.Thread(target=server.stop, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # SIGUSR1 (`docker kill -s USR1`): wedge a running engine now, for the soak and the demo (docs/simengine.md)
    signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=server.wedge, daemon=True).start())
    # SIGUSR2: the engine core dies now (crash_mid_generation's EngineDeadError path, exit 1), for the soak
    signal.signal(signal.SIGUSR2, lambda *_: threading.Thread(target=server.crash_now, daemon=True).start())
    try:
        server.start()
    except OSError as exc:
        where = repr(cfg.uds) if cfg.uds else f"('{cfg.host}', {cfg.port})"
        print(f"ERROR: [Errno {exc.errno}] error while attempting to bind on address "
              f"{where}: {exc.strerror}", file=sys.stderr)
        return 1
    code = None
    while code is None:
        code = server.wait(0.5)
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 137:
        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would (ignored where this is its container's PID 1)
    return code


if __name__ == "__main__":
    # os._exit, not sys.exit: the daemon threads (HTTP handlers, the engine loop) end with the process instead of
    # racing the interpreter's shutdown, which now and then died of SIGSEGV (exit 139 where 137 was simulated).
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
