"""Where the engine listens, and the one rule for reaching it (docs/engine.md, "Where the engine listens").

An engine the panel starts listens on a unix domain socket in a 0700 directory of the panel's state dir
(`<data dir>/.moet-panel/engine-sock/engine.sock`, vLLM's `--uds`), bind-mounted into the container at the
same path: a web page in the owner's browser cannot reach a socket file (no fetch, no `no-cors` POST, no DNS
rebinding), and another user of the box cannot enter the directory (issue 40, docs/gateway.md's threat table).
A recipe whose engine has no `--uds` sets `[serve] listen = "tcp"` and keeps 127.0.0.1:port.

`EngineEndpoint` is the one notion of that address. Its text form (`address`) is what snapshots, the gateway's
status feed and logs carry: `unix:/abs/path/engine.sock` or `http://127.0.0.1:8000`. Requests over a socket go
to `http://engine` (`url`: the Host header the engine sees) through a transport bound to the socket path.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from app.backend.config import env

if TYPE_CHECKING:
    from app.backend.recipe.schema import Recipe

STATE_SUBDIR = ".moet-panel"  # the panel's state dir inside the data dir (settings.Settings.state_dir)
SOCKET_SUBDIR = "engine-sock"
SOCKET_NAME = "engine.sock"
UDS_SCHEME = "unix:"
UDS_URL = "http://engine"  # the URL requests over the socket name; the engine sees Host: engine
LOOPBACK = "127.0.0.1"
WILDCARD_HOSTS = ("", "0.0.0.0", "::", "[::]")  # listen on every interface: connect on loopback
# sockaddr_un.sun_path is 108 bytes on Linux, NUL included: a longer path cannot be bound at all
SUN_PATH_MAX = 107
UDS_WHY = ("the engine listens on a unix socket in a 0700 directory of the panel's state dir, not on a TCP port: "
           "no web page the owner opens can reach it (fetch, no-cors POST, DNS rebinding) and no other user of the "
           "box can; the panel, the chat, the telemetry and `moet-panel gateway` reach it there (docs/engine.md)")
MOUNT_WHY = "the socket's 0700 directory, at the same path inside the container (the engine creates its socket there)"
PORT_IGNORED_WHY = "card's line, ignored by the engine: with --uds it opens no TCP port"


class EndpointError(ValueError):
    """An engine address that cannot be used (not unix:/abs/path nor http://HOST:PORT, or a socket path too long)."""


def connect_host(host: str) -> str:
    """The host to connect to for a server listening on `host` (a wildcard is reached on loopback)."""
    return LOOPBACK if host in WILDCARD_HOSTS else host


def socket_dir(data_dir: str | PurePosixPath | Path) -> str:
    """The 0700 directory holding the engine's socket: `<data dir>/.moet-panel/engine-sock`; for a data dir too
    deep for a socket path (108 bytes), a short one of its own in the user's cache home,
    `~/.cache/moet-sock-<12 hex of the data dir's path>` (short: it must fit too): every process of this user
    on this data dir computes the same one (docs/engine.md, "Where the engine listens")."""
    own = PurePosixPath(str(data_dir)) / STATE_SUBDIR / SOCKET_SUBDIR
    if len(os.fsencode(str(own / SOCKET_NAME))) <= SUN_PATH_MAX:
        return str(own)
    digest = hashlib.sha256(os.fsencode(str(data_dir))).hexdigest()[:12]
    return str(PurePosixPath(str(env.cache_home())) / f"moet-sock-{digest}")


def socket_name(gpu: int | None = None) -> str:
    """`engine.sock`; the engine of GPU N > 0 on a box of several (docs/engine.md "Several GPUs"): `gpuN.sock` in
    the same 0700 directory (no longer than `engine.sock`, so every data dir that fits one engine fits N; GPU 0
    keeps the one-GPU name, so a one-GPU box is as before)."""
    return SOCKET_NAME if not gpu else f"gpu{gpu}.sock"


def socket_path(data_dir: str | PurePosixPath | Path, gpu: int | None = None) -> str:
    path = str(PurePosixPath(socket_dir(data_dir)) / socket_name(gpu))
    if len(os.fsencode(path)) > SUN_PATH_MAX:
        raise EndpointError(f"the engine's socket path {path!r} is {len(os.fsencode(path))} bytes; a unix socket "
                            f"path holds at most {SUN_PATH_MAX}: use a shorter data dir or $XDG_CACHE_HOME")
    return path


@dataclass(frozen=True)
class EngineEndpoint:
    """Either a unix socket (`uds`, an absolute path) or host:port; never both."""

    uds: str = ""
    host: str = ""
    port: int = 0

    def __post_init__(self) -> None:
        if self.uds and not self.uds.startswith("/"):
            raise EndpointError(f"the engine's socket path {self.uds!r} is not absolute")
        if not self.uds and not (self.host and 0 < self.port <= 65535):
            raise EndpointError("an engine endpoint needs a socket path or a host and a port")

    @classmethod
    def unix(cls, path: str) -> EngineEndpoint:
        return cls(uds=path)

    @classmethod
    def tcp(cls, host: str, port: int) -> EngineEndpoint:
        return cls(host=connect_host(host), port=port)

    @classmethod
    def parse(cls, text: str) -> EngineEndpoint:
        """`unix:/p/engine.sock` (also `unix:///p/…`) or `http://host:port` (a trailing `/` or `/v1` is dropped)."""
        t = text.strip().rstrip("/").removesuffix("/v1").rstrip("/")
        if t.startswith(UDS_SCHEME):
            path = t[len(UDS_SCHEME):]
            path = "/" + path.lstrip("/") if path.startswith("//") else path
            return cls.unix(path)
        u = urlsplit(t)
        if u.scheme != "http" or not u.hostname or (u.path not in ("", "/")):
            raise EndpointError(f"the engine's address {text!r} is neither unix:/PATH nor http://HOST:PORT")
        try:
            port = u.port or 80
        except ValueError as exc:
            raise EndpointError(f"the engine's address {text!r} has a bad port") from exc
        return cls.tcp(u.hostname, port)

    @property
    def is_uds(self) -> bool:
        return bool(self.uds)

    @property
    def address(self) -> str:
        """The text form carried by snapshots and shown to people."""
        if self.uds:
            return UDS_SCHEME + self.uds
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The HTTP root requests are addressed to (over the socket for a uds endpoint)."""
        return UDS_URL if self.uds else self.address

    def __str__(self) -> str:
        return self.address


def ensure_socket_dir(sock_dir: str | Path) -> Path:
    """Create the socket's directory 0700 (and tighten an older one) before the engine starts: Docker would
    create a missing bind source itself, root-owned and 0755."""
    d = Path(sock_dir)
    d.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    d.mkdir(exist_ok=True, mode=0o700)
    if d.stat().st_mode & 0o077:
        d.chmod(0o700)
    return d


def engine_endpoint(recipe: Recipe, data_dir: str | Path, gpu: int | None = None) -> EngineEndpoint:
    """Where the engine the panel starts for `recipe` on `data_dir` (on GPU `gpu` of a box of several) listens
    (raises EndpointError when the socket path would be too long). A TCP engine of GPU N listens on port + N."""
    if recipe.serve.listen == "tcp":
        return EngineEndpoint.tcp(recipe.serve.host, recipe.serve.port + (gpu or 0))
    return EngineEndpoint.unix(socket_path(data_dir, gpu))
