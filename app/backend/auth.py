"""Web-UI credentials and the bind policy: the panel drives Docker (= root on this box), so it never
listens beyond loopback without authentication.

Credentials file: one `name:scrypt$N$r$p$salt$hash` line per user (salt/hash base64), `#` comments.
Hashing is stdlib `hashlib.scrypt` (memory-hard; no extra dependency). Write it with
`moet-panel serve --add-user NAME --auth-file FILE` (the password is read from a prompt or stdin).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.backend import env

SCRYPT_N, SCRYPT_R, SCRYPT_P, DKLEN = 2**14, 8, 1, 32
USER_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
MIN_PASSWORD = 8


class AuthError(ValueError):
    """The credentials file is missing, unsafe or malformed; the message says how to fix it."""


class BindingError(ValueError):
    """The requested listen address would expose the panel without authentication."""


def default_auth_path() -> Path:
    base = env.config_home()
    return base / "moet-panel" / "auth"


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, dklen=DKLEN, maxmem=128 * r * (n + p + 2) * 2)


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, SCRYPT_N, SCRYPT_R, SCRYPT_P)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, encoded: str) -> bool:
    try:
        kind, n, r, p, salt, digest = encoded.split("$")
        if kind != "scrypt":
            return False
        got = _scrypt(password, base64.b64decode(salt), int(n), int(r), int(p))
        return hmac.compare_digest(got, base64.b64decode(digest))
    except (ValueError, TypeError):
        return False


def load_users(path: Path) -> dict[str, str]:
    """Read a credentials file. Raises AuthError for a missing, group/world-writable or malformed file."""
    try:
        st = path.stat()
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AuthError(f"auth file {path}: cannot read ({exc.strerror or exc}); create it with "
                        f"`moet-panel serve --add-user NAME --auth-file {path}`") from None
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise AuthError(f"auth file {path} is writable by other users; run `chmod 600 {path}`")
    users: dict[str, str] = {}
    for no, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, encoded = line.partition(":")
        if not sep or not USER_RE.fullmatch(name) or not encoded.startswith("scrypt$") or encoded.count("$") != 5:
            raise AuthError(f"auth file {path}, line {no}: expected NAME:scrypt$... (write it with --add-user)")
        users[name] = encoded
    if not users:
        raise AuthError(f"auth file {path} has no users; add one with `moet-panel serve --add-user NAME --auth-file {path}`")
    return users


def add_user(path: Path, name: str, password: str) -> None:
    """Add or replace one user; the file is created 0600 and rewritten atomically."""
    if not USER_RE.fullmatch(name):
        raise AuthError("user name must be 1-64 characters of letters, digits, '_', '.', '@' or '-'")
    if len(password) < MIN_PASSWORD:
        raise AuthError(f"password must be at least {MIN_PASSWORD} characters")
    lines: list[str] = []
    if path.exists():
        lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.partition(":")[0].strip() != name]
    else:
        lines = ["# moet-panel web UI users (scrypt hashes). Manage with: moet-panel serve --add-user NAME"]
    lines.append(f"{name}:{hash_password(password)}")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, ("\n".join(lines) + "\n").encode())
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    os.replace(tmp, path)


@dataclass
class Strikes:
    """Failed logins counted for one key, and until when that key is locked."""

    failures: int = 0
    locked_until: float = 0.0


@dataclass
class LoginThrottle:
    """Slows password guessing per (user name, client address) and per client address, never
    globally: wrong passwords for one user from one address lock out that pair (and, past
    `free_failures_address`, that address), never the owner at another address. After the free
    failures a key is refused without checking until a lockout that doubles per further failure
    has passed (capped). Addresses come from the HTTP gate (app.backend.webgate), which refuses
    forwarding headers unless a reverse proxy is configured, so a client cannot pick its own."""

    free_failures: int = 5  # per (user, address)
    free_failures_address: int = 20  # per address, over all user names (guessing many names)
    max_lockout_s: float = 300.0
    max_keys: int = 10_000  # memory bound: unlocked keys are forgotten first
    clock: Callable[[], float] = time.monotonic
    keys: dict[tuple[str, str], Strikes] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @staticmethod
    def _pair(user: str, address: str) -> tuple[str, str]:
        return ("user", f"{user}\x00{address}")

    @staticmethod
    def _addr(address: str) -> tuple[str, str]:
        return ("address", address)

    def allowed(self, user: str, address: str) -> bool:
        now = self.clock()
        with self._lock:
            return all(self.keys.get(k, Strikes()).locked_until <= now
                       for k in (self._pair(user, address), self._addr(address)))

    def record(self, user: str, address: str, ok: bool) -> None:
        with self._lock:
            pair = self._pair(user, address)
            if ok:
                self.keys.pop(pair, None)  # the address count stays: a valid account must not reset it
                return
            now = self.clock()
            for key, free in ((pair, self.free_failures), (self._addr(address), self.free_failures_address)):
                strikes = self.keys.setdefault(key, Strikes())
                strikes.failures += 1
                extra = strikes.failures - free
                if extra >= 0:
                    strikes.locked_until = now + min(2.0 ** extra, self.max_lockout_s)
            self._prune(now)

    def _prune(self, now: float) -> None:
        if len(self.keys) <= self.max_keys:
            return
        for key in [k for k, s in self.keys.items() if s.locked_until <= now]:
            del self.keys[key]
            if len(self.keys) <= self.max_keys // 2:
                return
        while len(self.keys) > self.max_keys:  # all locked: forget the oldest
            del self.keys[next(iter(self.keys))]


def make_checker(users: dict[str, str], throttle: LoginThrottle | None = None,
                 client_address: Callable[[], str] | None = None,
                 on_failure: Callable[[str], None] | None = None) -> Callable[[str, str], bool]:
    """Gradio `auth=` callable. Every answer costs one scrypt, whether the user exists, the password
    is right or the key is locked out, so neither the user list nor the lock state shows in the
    response time; Gradio's login has no rate limit of its own. `client_address` names the client of
    the login in progress (default: the HTTP gate's record of the current request). `on_failure(reason)`
    counts failures for /metrics ("bad_credentials" or "locked_out")."""
    from app.backend.webgate import current_client

    dummy = hash_password(secrets.token_hex(8))
    gate = throttle or LoginThrottle()
    address_of = client_address or current_client

    def check(username: str, password: str) -> bool:
        address = address_of() or "unknown"
        allowed = gate.allowed(username, address)
        encoded = users.get(username)
        ok = verify_password(password or "", encoded or dummy) and encoded is not None  # always the work
        if not allowed or not ok:
            if on_failure is not None:
                on_failure("locked_out" if not allowed else "bad_credentials")
        if not allowed:
            return False
        gate.record(username, address, ok)
        return ok

    return check


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def check_binding(host: str, auth_on: bool) -> None:
    """Refuse a non-loopback bind without auth, explaining why."""
    if is_loopback(host) or auth_on:
        return
    raise BindingError(
        f"refusing to listen on {host!r} without authentication. moet-panel starts and stops Docker "
        "containers (Docker access is root on this machine) and holds your Hugging Face token, so anyone "
        "who can reach the page could take over the box. Either keep the default --host 127.0.0.1 (and "
        "use an SSH tunnel: ssh -L 7860:127.0.0.1:7860 HOST), or create users with "
        "`moet-panel serve --add-user NAME --auth-file FILE` and start with `--auth-file FILE` "
        "(or MOET_PANEL_AUTH_FILE=FILE)."
    )
