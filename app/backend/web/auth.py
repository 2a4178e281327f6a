"""Web-UI credentials and the bind policy: the panel drives Docker (= root on this box), so it never
listens beyond loopback without authentication.

Credentials file: one `name:scrypt$N$r$p$salt$hash` line per user (salt/hash base64), `#` comments.
Hashing is stdlib `hashlib.scrypt` (memory-hard; no extra dependency). Write it with
`moet-panel serve --add-user NAME --auth-file FILE` (the password is read from a prompt or stdin).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import ipaddress
import logging
import re
import secrets
import stat
import threading
import time
from array import array
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path

from app.backend import oplog

from app.backend.config import env
from app.backend.files.atomic import atomic_write

SCRYPT_N, SCRYPT_R, SCRYPT_P, DKLEN = 2**14, 8, 1, 32
USER_RE = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
NAME_CAP = 64  # a typed user name longer than this names no user (USER_RE): refused before it is kept or hashed
MIN_PASSWORD = 8
SESSION_IDLE_S = 2 * 3600.0  # a session ends this long after its last request ...
SESSION_LIFETIME_S = 24 * 3600.0  # ... or this long after sign-in (docs/ui-and-safety.md#sessions)


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


def auth_file_warning(path: Path) -> str | None:
    """A warning when the credentials file is readable by group/others (its scrypt hashes would let
    them guess offline); writable is refused outright by load_users."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        return (f"auth file {path} is readable by other users (mode {stat.S_IMODE(mode):03o}): they could try "
                f"passwords against its hashes offline. Run `chmod 600 {path}`.")
    return None


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
    atomic_write(path, "\n".join(lines) + "\n", mode=0o600)


def client_key(address: str) -> str:
    """The client a login is counted against. All of loopback (127.0.0.0/8, ::1, ::ffff:127.x) is ONE
    client: any local process can pick any 127.x source address, so counting them apart would give a
    local guesser a fresh budget per address (issue 30). An IPv6 client is its /64 (one host owns one)."""
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return address or "unknown"
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if isinstance(ip, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


@dataclass
class Pace:
    """Failed logins counted for one key, and the earliest time its next login may be checked."""

    failures: int = 0
    next_slot: float = 0.0
    last: float = 0.0


class _Cells:
    """`n` paces in three flat arrays, allocated once: the throttle's memory is fixed whatever is typed or
    whoever connects (issue 48: a table keyed by typed names grew by each name, and its prune reset the
    pacing of the account under attack)."""

    def __init__(self, n: int):
        self.failures = array("q", [0]) * n
        self.next_slot = array("d", [0.0]) * n
        self.last = array("d", [0.0]) * n

    def pace(self, i: int, now: float, forget_s: float) -> Pace:
        """Cell i as it stands at `now` (failures forgotten `forget_s` after the last one); changes nothing."""
        p = Pace(self.failures[i], self.next_slot[i], self.last[i])
        if p.failures and now - p.last > forget_s and p.next_slot <= now:
            return Pace()
        return p

    def store(self, i: int, p: Pace) -> None:
        self.failures[i], self.next_slot[i], self.last[i] = p.failures, p.next_slot, p.last

    def grow(self, n: int) -> None:
        """n more cells at the end (a user added to the known accounts); the others keep their counts."""
        self.failures.extend([0] * n)
        self.next_slot.extend([0.0] * n)
        self.last.extend([0.0] * n)


@dataclass(frozen=True)
class Slot:
    """A throttle answer: wait `wait_s` then check the password, or (`refused`) answer 429 at once.
    `keys` names the cells it was counted in: (kind, index)."""

    wait_s: float = 0.0
    refused: bool = False
    retry_after_s: float = 0.0
    keys: tuple[tuple[str, int], ...] = ()


@dataclass
class LoginThrottle:
    """Paces password guessing by *delaying* logins, never by locking an account (issue 30,
    docs/ui-and-safety.md#binding-and-authentication), in a fixed amount of memory (issue 48).

    Three kinds of key, each with its own count of failures:
    * the account — every untrusted login for that user name, from any address. A user of the
      credentials file (`accounts()`) has a cell of its own, never shared or dropped; any other typed
      name is a cell of a fixed table chosen by a keyed digest of the name (its first `NAME_CAP`
      characters), so an unknown name costs a paced slot, never memory;
    * the client (client_key: all of loopback is one, an IPv6 client its /64), in a fixed table the same way;
    * the device — logins from a browser that signed in before (a device key that page keeps in
      storage scoped to its origin, so another port of the host cannot present it). Such a login
      is paced on its device key alone: other people's failures never slow the owner's browser.

    Tables are never pruned, so no flood of names or addresses resets an account's count; two names or
    two clients that share a cell share its pacing (stricter, never looser). Past `free` failures a key
    admits one login per `interval_s`: logins are given successive slots and wait for theirs, so no
    number of concurrent requests or source addresses checks passwords faster than `free` + 4 a minute.
    A login whose slot lies more than `horizon_s` ahead is refused at once (429, no scrypt) and changes
    nothing: the decision comes before anything is stored. Each admitted login counts as a failure when
    its slot is given (concurrent guesses cannot share the free ones) and a success takes it back. A
    key's failures are forgotten `forget_s` after its last.
    Once a flood stops, any login waits at most `horizon_s` + `interval_s` (< 1 min)."""

    free_account: int = 5
    free_client: int = 20
    free_device: int = 5
    interval_s: float = 15.0  # past the free failures, one login per interval: 4 a minute
    horizon_s: float = 30.0
    forget_s: float = 900.0
    cells: int = 8192  # per table (typed names, clients, devices): 3 x 8192 x 24 bytes, allocated once
    max_accounts: int = 4096  # users with a cell of their own; beyond, they share the names' table
    clock: Callable[[], float] = time.monotonic
    _secret: bytes = field(default_factory=lambda: secrets.token_bytes(16), repr=False)
    _own: dict[bytes, int] = field(default_factory=dict, repr=False)  # a known user's digest -> its cell
    _tables: dict[str, _Cells] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self._tables = {kind: _Cells(self.cells) for kind in ("name", "client", "device")}
        self._tables["account"] = _Cells(0)

    def accounts(self, names: Iterable[str]) -> None:
        """Give these user names (the credentials file's) a cell each, that nothing else shares."""
        with self._lock:
            had = len(self._own)
            for name in names:
                if len(self._own) >= self.max_accounts:
                    break
                self._own.setdefault(self._digest(name), len(self._own))
            self._tables["account"].grow(len(self._own) - had)

    def _digest(self, text: str) -> bytes:
        # keyed: nobody outside the process can pick names that land in a cell of their choosing
        return hashlib.blake2b(text[:NAME_CAP].encode("utf-8", "surrogatepass"), digest_size=8,
                               key=self._secret).digest()

    def _cell(self, kind: str, text: str) -> int:
        return int.from_bytes(self._digest(text), "big") % self.cells

    def _free(self, kind: str) -> int:
        if kind in ("account", "name"):
            return self.free_account
        return self.free_client if kind == "client" else self.free_device

    def _interval(self, kind: str, failures: int) -> float:
        """The wait after this login, `failures` counting it: none within the free ones, then `interval_s`,
        so a key checks at most `free` + 60 / `interval_s` a minute from the first (issue 48: a ramp of
        1, 2, 4, 8 s before it gave 10 checks in the first 15 s)."""
        return 0.0 if failures < self._free(kind) else self.interval_s

    def _keys_for(self, user: str, address: str, device: str | None) -> tuple[tuple[str, int], ...]:
        if device:
            return (("device", self._cell("device", device)),)
        own = self._own.get(self._digest(user))
        account = ("account", own) if own is not None else ("name", self._cell("name", user))
        return (account, ("client", self._cell("client", client_key(address))))

    def reserve(self, user: str, address: str, device: str | None = None) -> Slot:
        """Give this login a slot (how long to wait before checking it) or refuse it, storing nothing."""
        now = self.clock()
        with self._lock:
            keys = self._keys_for(user, address, device)
            paces = [self._tables[kind].pace(i, now, self.forget_s) for kind, i in keys]
            start = max([now, *(p.next_slot for p in paces)])
            if start - now > self.horizon_s:  # decided before anything is stored: a refusal adds nothing
                return Slot(refused=True, retry_after_s=start - now - self.horizon_s + 1.0, keys=keys)
            for (kind, i), pace in zip(keys, paces, strict=True):
                pace.failures += 1  # counted now, taken back on success: concurrent guesses share nothing
                pace.next_slot = start + self._interval(kind, pace.failures)
                pace.last = now
                self._tables[kind].store(i, pace)
            return Slot(wait_s=start - now, keys=keys)

    def record(self, slot: Slot, ok: bool) -> None:
        """The outcome of a login that had a slot: a success takes its counted failure back."""
        if not ok or slot.refused:
            return
        with self._lock:
            for kind, i in slot.keys:
                cells = self._tables[kind]
                if cells.failures[i] > 0:
                    cells.failures[i] -= 1

    def failures(self, user: str, address: str = "", device: str | None = None) -> tuple[int, ...]:
        """The failure counts a login of `user` from `address` would be paced on now (for tests and docs)."""
        now = self.clock()
        with self._lock:
            return tuple(self._tables[k].pace(i, now, self.forget_s).failures
                         for k, i in self._keys_for(user, address, device))


@dataclass
class LoginNote:
    """What one login request carries in and what the checker says back, shared between the HTTP
    gate (which knows the client and the request's headers, and writes the HTTP answer) and the
    checker Gradio calls (which knows the outcome). app.backend.web.gate sets it per /login request."""

    address: str = ""
    device: str | None = None  # the device key the page presented (X-Moet-Device)
    device_user: str | None = None  # the user that device key was issued to (DeviceBook), if any
    refused: bool = False  # throttled: answer 429 with retry_after_s
    busy: bool = False  # too many logins being checked at once: answer 503
    invalid: str = ""  # refused unchecked for its form (a user name over NAME_CAP): answer 400 with this
    retry_after_s: float = 0.0
    user: str | None = None  # set on success: the user the device key is issued to


# The login in progress (POST /login), set by app.backend.web.gate per request: the checker reads the client and
# device key, writes the outcome.
LOGIN_NOTE: ContextVar[LoginNote | None] = ContextVar("moet_panel_login_note", default=None)


def current_login() -> LoginNote | None:
    """The LoginNote of the POST /login in progress (None outside one)."""
    return LOGIN_NOTE.get()


@dataclass
class DeviceBook:
    """Device keys: issued to a browser on a successful login, kept by its page in storage scoped to
    the panel's origin, presented on later logins so that browser is throttled on its own
    (LoginThrottle). In memory: after a restart every browser is untrusted until it signs in again."""

    max_devices: int = 1_000
    devices: dict[str, str] = field(default_factory=dict)  # key -> user
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def issue(self, user: str) -> str:
        key = secrets.token_urlsafe(32)
        with self._lock:
            self.devices[key] = user
            while len(self.devices) > self.max_devices:
                del self.devices[next(iter(self.devices))]
        return key

    def user_of(self, key: str | None) -> str | None:
        if not key:
            return None
        with self._lock:
            return self.devices.get(key)


@dataclass
class Session:
    user: str
    key: str
    created: float
    seen: float


@dataclass
class SessionBook:
    """The panel's own record of signed-in sessions, beside Gradio's token table: each session (the
    token in Gradio's cookie) has a second secret, the session key, that the panel's page keeps in
    origin-scoped storage and sends as a header (docs/ui-and-safety.md#sessions). A session ends
    after `idle_s` without a request, `lifetime_s` after sign-in, or at sign-out (all of the
    user's sessions at once)."""

    idle_s: float = SESSION_IDLE_S
    lifetime_s: float = SESSION_LIFETIME_S
    max_sessions: int = 1_000
    clock: Callable[[], float] = time.time
    sessions: dict[str, Session] = field(default_factory=dict)  # Gradio token -> Session
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def open(self, token: str, user: str) -> str:
        now = self.clock()
        key = secrets.token_urlsafe(32)
        with self._lock:
            self.sessions[token] = Session(user=user, key=key, created=now, seen=now)
            self._expire(now)
            while len(self.sessions) > self.max_sessions:
                del self.sessions[next(iter(self.sessions))]
        return key

    def user_of(self, token: str | None, key: str | None) -> str | None:
        """The session's user when token and key match a live session (and it is touched)."""
        if not token or not key:
            return None
        now = self.clock()
        with self._lock:
            s = self.sessions.get(token)
            if s is None or not hmac.compare_digest(s.key.encode(), key.encode()):
                return None
            if now - s.seen > self.idle_s or now - s.created > self.lifetime_s:
                del self.sessions[token]
                return None
            s.seen = now
            return s.user

    def close_user(self, user: str) -> list[str]:
        """End every session of `user` (sign out everywhere); returns their tokens."""
        with self._lock:
            gone = [t for t, s in self.sessions.items() if s.user == user]
            for t in gone:
                del self.sessions[t]
        return gone

    def expired(self) -> list[str]:
        """Remove and return the tokens of sessions past their idle or absolute limit."""
        with self._lock:
            return self._expire(self.clock())

    def _expire(self, now: float) -> list[str]:
        gone = [t for t, s in self.sessions.items() if now - s.seen > self.idle_s or now - s.created > self.lifetime_s]
        for t in gone:
            del self.sessions[t]
        return gone


@dataclass
class LoginGuard:
    """Everything the login path shares: the throttle and the bound on scrypt work
    in flight (at most `max_checking` hashes at once, at most `max_waiting` more queued; beyond that
    a login is answered 503 at once), so a flood of logins cannot starve signed-in users of CPU."""

    throttle: LoginThrottle = field(default_factory=LoginThrottle)
    max_checking: int = 1
    max_waiting: int = 4
    in_flight: int = 0
    _sem: asyncio.Semaphore | None = field(default=None, repr=False)


def make_checker(users: dict[str, str], guard: LoginGuard | None = None,
                 note_of: Callable[[], LoginNote | None] | None = None,
                 on_failure: Callable[[str], None] | None = None) -> Callable[[str, str], Awaitable[bool]]:
    """Gradio `auth=` callable (a coroutine: Gradio awaits it, so a paced login waits without holding a
    thread). Every checked login costs one scrypt, whether the user exists or the password is right,
    so the user list does not show in the response time. `note_of` gives the LoginNote of the login
    in progress (default: the HTTP gate's); the checker writes refusals and the signed-in user there.
    `on_failure(reason)` counts failures ("bad_credentials", or "locked_out" for a throttled or busy
    answer) for /metrics."""
    dummy = hash_password(secrets.token_hex(8))
    g = guard or LoginGuard()
    g.throttle.accounts(users)  # each user paced on a cell of its own (LoginThrottle)
    note_for = note_of or current_login

    async def check(username: str, password: str) -> bool:
        note = note_for() or LoginNote()
        if len(username) > NAME_CAP:  # first: nothing of a long name is kept, hashed, logged or paced
            note.invalid = f"User names are at most {NAME_CAP} characters; this one has {len(username)}."
            oplog.decision("auth", "login_refused", who=oplog.user(_shown_name(username)),
                           level=logging.WARNING, address=note.address,
                           reason=f"user name over {NAME_CAP} characters")
            if on_failure is not None:
                on_failure("bad_credentials")
            return False
        device = note.device if note.device and note.device_user == username else None  # its own user only
        slot = g.throttle.reserve(username, note.address, device)
        who = oplog.user(_shown_name(username))
        if slot.refused:
            note.refused, note.retry_after_s = True, slot.retry_after_s
            oplog.decision("auth", "login_refused", who=who, level=logging.WARNING, address=note.address,
                           reason="paced: too many failed logins", retry_after_s=round(slot.retry_after_s, 1))
            if on_failure is not None:
                on_failure("locked_out")
            return False
        if slot.wait_s > 0:
            oplog.decision("auth", "login_paced", who=who, address=note.address, wait_s=round(slot.wait_s, 1))
            await asyncio.sleep(slot.wait_s)  # a paced login waits here: a sleeping coroutine, no thread
        # A browser that signed in before (its device key) is never turned away as busy: its own logins are
        # paced on that key, so a flood of strangers' guesses cannot keep the owner out (issue 30).
        if device is None and g.in_flight >= g.max_checking + g.max_waiting:
            g.throttle.record(slot, True)  # not checked: does not count as a failure
            note.busy, note.retry_after_s = True, 2.0
            oplog.decision("auth", "login_refused", who=who, level=logging.WARNING, address=note.address,
                           reason="busy: too many logins being checked")
            if on_failure is not None:
                on_failure("locked_out")
            return False
        g.in_flight += 1
        try:
            if g._sem is None:
                g._sem = asyncio.Semaphore(g.max_checking)
            encoded = users.get(username)
            async with g._sem:
                ok = await asyncio.to_thread(verify_password, password or "", encoded or dummy)
            ok = ok and encoded is not None
        finally:
            g.in_flight -= 1
        g.throttle.record(slot, ok)
        if ok:
            note.user = username
            oplog.decision("auth", "login", who=who, address=note.address)
        else:
            oplog.decision("auth", "login_failed", who=who, level=logging.WARNING, address=note.address,
                           reason="bad credentials")
            if on_failure is not None:
                on_failure("bad_credentials")
        return ok

    return check


def _shown_name(name: str) -> str:
    """A typed user name as the log may show it: printable, at most 64 characters (it is the stranger's text)."""
    shown = "".join(c if c.isprintable() else "?" for c in (name or "")[:NAME_CAP])
    return shown or "(empty)"


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
