"""Run the panel as a systemd service (docs/engine.md, "Run as a service").

`unit_text()` writes the unit, `install()` places and enables it (when systemctl can talk to a running
systemd; otherwise it says what to run), and `sd_notify()` tells systemd the panel is ready — the
protocol is one datagram on the unix socket in $NOTIFY_SOCKET (sd_notify(3)), so no library is needed.

Hardening (docs/engine.md "Run as a service"): `WatchdogSec=` with the panel's earned pings
(app/backend/service/watchdog.py), `NoNewPrivileges`, `UMask=0077`, a start limit, and for a system unit
`ProtectSystem=strict` + `PrivateTmp` with `ReadWritePaths=` for the data, state and config dirs. Docker keeps
working: /run/docker.sock is in no private or read-only way (a read-only mount does not stop a connect() to
a socket, and PrivateTmp touches /tmp and /var/tmp only). A user unit leaves the mount sandbox out: in a user
manager it needs a user namespace, where the `docker` group is lost and the socket refuses the panel.

The unit stops the panel with SIGTERM to its main process only (`KillMode=process`): the engine is a Docker
container (dockerd's child, not ours) — and in demo mode without Docker a local process the panel reattaches
to — so a `systemctl stop` or a panel upgrade never stops what is serving.
"""

from __future__ import annotations

import getpass
import os
import shlex
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from app.backend import oplog

from app.backend.config import env

UNIT_NAME = "moet-panel.service"


def sd_notify(message: str, socket_path: str | None = None) -> bool:
    """Send `message` (e.g. "READY=1") to systemd; False when not run by systemd (no $NOTIFY_SOCKET)."""
    path = socket_path if socket_path is not None else env.notify_socket()
    if not path:
        return False
    addr = "\0" + path[1:] if path.startswith("@") else path  # '@' = Linux abstract namespace
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            s.sendall(message.encode())
        return True
    except OSError:
        return False


@dataclass(frozen=True)
class UnitSpec:
    exec_start: tuple[str, ...]
    working_dir: Path
    user_mode: bool
    user: str = ""  # system units run as this user (the one who installs)
    environment: tuple[tuple[str, str], ...] = ()
    rw_paths: tuple[Path, ...] = ()  # writable under ProtectSystem=strict (must exist when the unit starts)
    optional_rw_paths: tuple[Path, ...] = ()  # writable if they exist ("-" prefix: a missing one is skipped)
    watchdog_s: int = 30
    start_limit_interval_s: int = 600
    start_limit_burst: int = 5


def _path_arg(p: Path, optional: bool = False) -> str:
    """One ReadWritePaths= word: the "-" prefix (skip if missing) inside the quotes a path with blanks needs."""
    text = ("-" if optional else "") + str(p)
    if any(c.isspace() or c in "\\\"'" for c in text):
        text = '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return _pct(text)


def _pct(text: str) -> str:
    return text.replace("%", "%%")  # '%' starts a unit-file specifier (systemd.unit(5))


def _env_line(k: str, v: str) -> str:
    quoted = f"{k}={v}".replace("\\", "\\\\").replace('"', '\\"')
    return f'Environment="{_pct(quoted)}"'


def unit_text(spec: UnitSpec) -> str:
    cmd = _pct(" ".join(shlex.quote(a) for a in spec.exec_start))
    lines = [
        "[Unit]",
        "Description=moet-panel: control panel of the MoE engine (keeps serving when nobody watches)",
        "Documentation=file://" + str(spec.working_dir / "docs" / "engine.md"),
        "After=network-online.target" + ("" if spec.user_mode else " docker.service"),
        "Wants=network-online.target",
        # at most `burst` starts in `interval`: a panel that cannot start stops being restarted (status says so)
        f"StartLimitIntervalSec={spec.start_limit_interval_s}",
        f"StartLimitBurst={spec.start_limit_burst}",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={cmd}",
        f"WorkingDirectory={_pct(str(spec.working_dir))}",
        *(_env_line(k, v) for k, v in spec.environment),
        "Restart=on-failure",
        "RestartSec=5",
        "KillMode=process",  # SIGTERM to the panel only: the engine keeps serving
        "TimeoutStartSec=300",
        "TimeoutStopSec=30",
        # WATCHDOG=1 only while the engine reconciler turns (service/watchdog.py): a wedged panel is restarted
        f"WatchdogSec={spec.watchdog_s}",
        "NoNewPrivileges=yes",
        "UMask=0077",  # every file the panel makes is the owner's alone (secrets, logs, databases)
    ]
    if not spec.user_mode:
        rw = [_path_arg(p) for p in spec.rw_paths] + [_path_arg(p, True) for p in spec.optional_rw_paths]
        lines += ["ProtectSystem=strict", "PrivateTmp=yes", *([f"ReadWritePaths={' '.join(rw)}"] if rw else [])]
    if not spec.user_mode and spec.user:
        lines.append(f"User={spec.user}")
    lines += ["", "[Install]", f"WantedBy={'default.target' if spec.user_mode else 'multi-user.target'}", ""]
    return "\n".join(lines)


def unit_path(user_mode: bool) -> Path:
    if user_mode:
        return env.config_home() / "systemd" / "user" / UNIT_NAME
    return Path("/etc/systemd/system") / UNIT_NAME


def systemd_running() -> bool:
    """systemctl can act only when systemd is PID 1 (containers and CI images often have the binary only)."""
    return shutil.which("systemctl") is not None and Path("/run/systemd/system").is_dir()


@dataclass(frozen=True)
class InstallResult:
    path: Path
    enabled: bool
    lines: tuple[str, ...]  # what to tell the person (what was done, what to run, how to check)


def install(spec: UnitSpec, path: Path | None = None, *, enable: bool = True) -> InstallResult:
    """Write the unit; enable and start it when systemctl is usable, else say what to run."""
    target = path or unit_path(spec.user_mode)
    target.parent.mkdir(parents=True, exist_ok=True)
    for p in spec.rw_paths:  # ReadWritePaths= must exist when the unit starts, or the start fails
        try:
            p.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:  # a system unit's data dir may belong to its user: the start then names it
            oplog.caught("service", exc, "creating a ReadWritePaths= folder of the unit", path=p)
    target.write_text(unit_text(spec), encoding="utf-8")
    ctl = ["systemctl", "--user"] if spec.user_mode else ["systemctl"]
    name = UNIT_NAME.removesuffix(".service")
    journal = f"journalctl {'--user-unit' if spec.user_mode else '-u'} {name} -f"
    cmds = [ctl + ["daemon-reload"], ctl + ["enable", "--now", name]]
    out = [f"wrote {target}"]
    enabled = False
    if enable and systemd_running():
        for c in cmds:
            r = subprocess.run(c, capture_output=True, text=True, check=False)
            if r.returncode != 0:
                out.append(f"`{' '.join(c)}` failed: {(r.stderr or r.stdout).strip()}")
                break
        else:
            enabled = True
            out.append(f"enabled and started {name}")
    if not enabled:
        out.append("systemd is not running here (or --no-enable): run")
        out += [f"  {' '.join(c)}" for c in cmds]
    if spec.user_mode:
        out.append(f"  loginctl enable-linger {spec.user or getpass.getuser()}   # start at boot, without a login")
    out.append("check it:")
    out.append(f"  {' '.join(ctl)} status {name}")
    out.append(f"  {journal}")
    return InstallResult(target, enabled, tuple(out))


def writable_paths(data_dir: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """(paths the panel must write, paths it writes if they exist) under ProtectSystem=strict: the data dir and
    its state dir, the panel's config dir (HF token, auth file); the demo data dir and ~/.cache (huggingface_hub's
    locks and Xet cache) when present."""
    from app.backend.config.settings import STATE_SUBDIR

    must = (data_dir, data_dir / STATE_SUBDIR, env.config_home() / "moet-panel")
    maybe = (env.data_home() / "moet-panel", Path.home() / ".cache")
    return must, tuple(p for p in maybe if p not in must)


def default_spec(user_mode: bool, serve_args: list[str], working_dir: Path, python: str,
                 data_dir: Path | None = None) -> UnitSpec:
    """The panel as `run-panel.sh` starts it: this checkout's Python, `-m app.cli.main serve ARGS`."""
    # MOET_PANEL_NOTIFY stays out: unit files are world-readable and its URLs hold secrets (set them in the
    # Service tab instead: <state_dir>/service.json is the user's own file).
    keep = tuple((k, v) for k, v in sorted(env.inherited(prefixes=("MOET_PANEL_",)).items()) if k != env.NOTIFY)
    must, maybe = writable_paths(data_dir) if data_dir is not None else ((), ())
    return UnitSpec((python, "-m", "app.cli.main", "serve", *serve_args), working_dir, user_mode,
                    user="" if user_mode else getpass.getuser(), environment=keep, rw_paths=must,
                    optional_rw_paths=maybe)


def current_python() -> str:
    """This interpreter as invoked (the venv's bin/python: resolving the link would lose the venv)."""
    import sys

    return os.path.abspath(sys.executable)
