"""API keys, usage per key and the recent-activity log of the gateway, in one SQLite file (0600).

Keys are 256-bit random strings shown once; only their SHA-256 is stored (a fast hash is right for
high-entropy keys: there is nothing to guess, docs/gateway.md#keys). A running gateway reloads the keys
when another process commits (SQLite's `PRAGMA data_version`), checked at most every `recheck_s`, so a
`keys revoke` takes effect within that interval (and ends the key's running requests: proxy.py's tick). Every
key has a `scope`: `inference` opens the gateway; `metrics` opens the panel's `/metrics` (docs/metrics.md#access)
and nothing of the gateway. Creations and revocations go to the operator's log (never the key).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from app.backend import oplog
from app.backend.files.modes import create_private

DB_NAME = "gateway.sqlite"
KEY_PREFIX = "mpk-"  # recognisable in a leak scan; the rest is 43 characters of token_urlsafe(32)
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SCOPES = ("inference", "metrics", "fleet")
DEFAULT_SCOPE = "inference"
# a box behind a fleet's front (docs/fleet.md#trust): the front's key; a box holding an active one answers it alone
FLEET_SCOPE = "fleet"
ACTIVITY_KEEP = 1000  # rows of the activity table kept on disk
MAX_TOKENS_LIMIT = 10_000_000  # a key's own max_tokens cap: a sanity bound (the gateway caps it at the context)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (
    name TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    hint TEXT NOT NULL,
    scope TEXT NOT NULL DEFAULT 'inference',
    created REAL NOT NULL,
    expires REAL,
    revoked REAL,
    max_tokens INTEGER
);
CREATE TABLE IF NOT EXISTS usage (
    name TEXT PRIMARY KEY,
    requests INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    errors INTEGER NOT NULL DEFAULT 0,
    last_used REAL
);
CREATE TABLE IF NOT EXISTS activity (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    key_name TEXT NOT NULL,
    route TEXT NOT NULL,
    status INTEGER NOT NULL,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    ttft_s REAL,
    duration_s REAL,
    tok_s REAL,
    error TEXT NOT NULL DEFAULT '',
    request_body TEXT,
    response_body TEXT
);
"""


# the panel's own key for its Chat tab (gateway/service.py; docs/chat.md "Taking turns"): made by the panel
PANEL_CHAT_KEY = "panel-chat"


class KeyStoreError(ValueError):
    """A key operation was refused; the message says why and what to do."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        shown = name if isinstance(name, str) and name.isprintable() and len(name) <= 80 else "(unprintable or too long)"
        raise KeyStoreError(f"key name {shown!r} is not allowed: use 1-64 letters, digits, '.', '_' or '-', "
                        "starting with a letter or digit")
    return name


def _check_max_tokens(n: int | None) -> None:
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TOKENS_LIMIT):
        raise KeyStoreError(f"max tokens {n!r}: expected a whole number of tokens from 1 to {MAX_TOKENS_LIMIT:,}")


@dataclass(frozen=True)
class KeyRecord:
    name: str
    hash: str
    hint: str  # the key's first characters, to tell keys apart in a list (never enough to use it)
    scope: str
    created: float
    expires: float | None
    revoked: float | None
    max_tokens: int | None = None  # this key's max_tokens cap a request; None: the gateway's (docs/gateway.md#caps)

    def status(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        if self.revoked is not None:
            return "revoked"
        if self.expires is not None and now >= self.expires:
            return "expired"
        return "active"


@dataclass(frozen=True)
class Usage:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0
    last_used: float | None = None


@dataclass(frozen=True)
class KeyInfo:
    """A key with its usage, as `keys list` and the Access tab show it (never the key itself)."""

    name: str
    hint: str
    scope: str
    status: str
    created: float
    expires: float | None
    revoked: float | None
    usage: Usage
    max_tokens: int | None = None

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "hint": self.hint, "scope": self.scope, "status": self.status,
                "created": self.created, "expires": self.expires, "revoked": self.revoked,
                "max_tokens": self.max_tokens,
                "requests": self.usage.requests, "prompt_tokens": self.usage.prompt_tokens,
                "completion_tokens": self.usage.completion_tokens, "errors": self.usage.errors,
                "last_used": self.usage.last_used}


@dataclass(frozen=True)
class CreatedKey:
    name: str
    key: str  # shown once; not stored
    scope: str
    expires: float | None


@dataclass(frozen=True)
class ActivityRecord:
    """One request through the gateway: metadata only unless body capture is on (docs/gateway.md#activity)."""

    time: float
    key_name: str
    route: str
    status: int
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    duration_s: float = 0.0
    tok_s: float | None = None
    error: str = ""
    request_body: str | None = None
    response_body: str | None = None


@dataclass
class _Pending:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    errors: int = 0
    last_used: float | None = None


class KeyStore:
    """The gateway's SQLite file. Thread-safe; each call is short. The request path (`authenticate`, `record`)
    never waits on a write: keys are checked in memory, reloaded through a second, read-only connection,
    and usage/activity go to an in-memory buffer that `flush()` (a thread, once a second) writes."""

    def __init__(self, state_dir: Path, recheck_s: float = 0.25):
        self.path = Path(state_dir) / DB_NAME
        create_private(self.path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, timeout=10)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            columns = {r[1] for r in self._db.execute("PRAGMA table_info(keys)")}
            if "max_tokens" not in columns:  # a store made before per-key caps (issue 48)
                self._db.execute("ALTER TABLE keys ADD COLUMN max_tokens INTEGER")
            self._db.commit()
        # the keys' reader: its own connection and lock, so a reload never waits behind a flush's commit
        self._watch_lock = threading.Lock()
        self._watch = sqlite3.connect(str(self.path), check_same_thread=False, timeout=10)
        self._buf_lock = threading.Lock()  # the usage/activity buffer only (held for microseconds)
        self._flush_lock = threading.Lock()
        self._recheck_s = recheck_s
        self._checked = 0.0
        self._version = -1
        self._by_hash: dict[str, KeyRecord] = {}
        self._pending: dict[str, _Pending] = {}
        self._activity: list[ActivityRecord] = []

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._db.close()
        with self._watch_lock:
            self._watch.close()

    # -- keys -------------------------------------------------------------------------------------
    def create(self, name: str, expires_days: float | None = None, scope: str = DEFAULT_SCOPE, *,
               who: str = oplog.PANEL, panel_own: bool = False, max_tokens: int | None = None,
               key: str | None = None) -> CreatedKey:
        """`panel_own`: the panel making its Chat tab's key (PANEL_CHAT_KEY, a name nobody else may take).
        `key`: a value made elsewhere to accept (the fleet's key, made by the front: every box must accept the
        same one, as the router forwards the front's header unchanged; docs/fleet.md#trust); None: a new one."""
        check_name(name)
        if name == PANEL_CHAT_KEY and not panel_own:
            raise KeyStoreError(f"the name {name!r} is the panel's own (its Chat tab's key, docs/chat.md); pick another")
        _check_max_tokens(max_tokens)
        if key is not None and not (key.startswith(KEY_PREFIX) and 40 <= len(key) <= 256 and key.isprintable()
                                    and " " not in key):
            raise KeyStoreError(f"a key to accept must be one a moet-panel made ({KEY_PREFIX}… , 40-256 characters)")
        if scope not in SCOPES:
            raise KeyStoreError(f"scope {scope!r} is not one of {', '.join(SCOPES)}")
        if expires_days is not None and not (0 < expires_days <= 3650):
            raise KeyStoreError(f"--expires-days {expires_days:g}: expected a number of days between 0 and 3650")
        key = key if key is not None else KEY_PREFIX + secrets.token_urlsafe(32)
        now = time.time()
        expires = now + expires_days * 86400 if expires_days is not None else None
        with self._lock:
            row = self._db.execute("SELECT revoked FROM keys WHERE name=?", (name,)).fetchone()
            if row is not None and row[0] is None:
                raise KeyStoreError(f"a key named {name!r} exists; revoke it first (`moet-panel keys revoke {name}`) "
                                "or pick another name")
            # a revoked name may be reused: its old hash is replaced, its usage kept
            self._db.execute("INSERT OR REPLACE INTO keys (name, hash, hint, scope, created, expires, revoked, max_tokens) "
                             "VALUES (?, ?, ?, ?, ?, ?, NULL, ?)",
                             (name, hash_key(key), key[:8] + "…", scope, now, expires, max_tokens))
            self._db.execute("INSERT OR IGNORE INTO usage (name) VALUES (?)", (name,))
            self._db.commit()
        self._checked = 0.0
        oplog.decision("gateway", "key_created", who=who, key_name=name, scope=scope,
                       expires_days=expires_days if expires_days is not None else "never",
                       max_tokens=max_tokens if max_tokens is not None else "the gateway's")
        return CreatedKey(name=name, key=key, scope=scope, expires=expires)

    def revoke(self, name: str, *, who: str = oplog.PANEL) -> bool:
        """Revoke `name`; False when there is no active key by that name."""
        check_name(name)
        with self._lock:
            cur = self._db.execute("UPDATE keys SET revoked=? WHERE name=? AND revoked IS NULL", (time.time(), name))
            self._db.commit()
        self._checked = 0.0
        if cur.rowcount > 0:
            oplog.decision("gateway", "key_revoked", who=who, key_name=name)
        return cur.rowcount > 0

    def set_max_tokens(self, name: str, max_tokens: int | None, *, who: str = oplog.PANEL) -> bool:
        """This key's own max_tokens cap (None: the gateway's again); a running gateway applies it within a
        second. False when there is no active key by that name."""
        check_name(name)
        _check_max_tokens(max_tokens)
        with self._lock:
            cur = self._db.execute("UPDATE keys SET max_tokens=? WHERE name=? AND revoked IS NULL", (max_tokens, name))
            self._db.commit()
        self._checked = 0.0
        if cur.rowcount > 0:
            oplog.decision("gateway", "key_max_tokens", who=who, key_name=name,
                           max_tokens=max_tokens if max_tokens is not None else "the gateway's")
        return cur.rowcount > 0

    @staticmethod
    def _records_of(db: sqlite3.Connection) -> list[KeyRecord]:
        rows = db.execute("SELECT name, hash, hint, scope, created, expires, revoked, max_tokens FROM keys "
                          "ORDER BY created")
        return [KeyRecord(*r) for r in rows]

    def _records(self) -> list[KeyRecord]:
        return self._records_of(self._db)

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < self._recheck_s:
            return
        with self._watch_lock:
            self._checked = now
            # data_version moves when any other connection commits: another process's `keys revoke` and
            # this store's own writer connection alike (sqlite.org/pragma.html#pragma_data_version)
            version = int(self._watch.execute("PRAGMA data_version").fetchone()[0])
            if version == self._version:
                return
            self._version = version
            self._by_hash = {r.hash: r for r in self._records_of(self._watch)}

    def authenticate(self, key: str, scope: str = DEFAULT_SCOPE) -> KeyRecord | None:
        """The active key record for `key` with `scope`, or None. The lookup is by hash (the key never
        compared as text); the stored hash is then compared in constant time."""
        if not key or len(key) > 256:
            return None
        self._refresh()
        digest = hash_key(key)
        rec = self._by_hash.get(digest)
        if rec is None or not hmac.compare_digest(rec.hash, digest):
            return None
        if rec.status() != "active" or rec.scope != scope:
            return None
        return rec

    def identify(self, key: str) -> KeyRecord | None:
        """The record of `key` whatever its status (a revoked or expired key's refusal names it), or None."""
        if not key or len(key) > 256:
            return None
        self._refresh()
        digest = hash_key(key)
        rec = self._by_hash.get(digest)
        return rec if rec is not None and hmac.compare_digest(rec.hash, digest) else None

    def fleet_member(self) -> bool:
        """An active key of scope `fleet` is held: this box serves a fleet's front, and only it (docs/fleet.md)."""
        self._refresh()
        now = time.time()
        return any(r.scope == FLEET_SCOPE and r.status(now) == "active" for r in self._by_hash.values())

    def still_active(self, digest: str) -> bool:
        """The key with this hash is still active (checked by the gateway for its running requests)."""
        self._refresh()
        rec = self._by_hash.get(digest)
        return rec is not None and rec.status() == "active"

    def active_count(self, scope: str | tuple[str, ...] = DEFAULT_SCOPE, *, owners_only: bool = False) -> int:
        """`owners_only`: not counting the panel's own Chat tab key (PANEL_CHAT_KEY)."""
        scopes = (scope,) if isinstance(scope, str) else scope
        now = time.time()
        with self._lock:
            return sum(1 for r in self._records() if r.scope in scopes and r.status(now) == "active"
                       and not (owners_only and r.name == PANEL_CHAT_KEY))

    def infos(self) -> list[KeyInfo]:
        self.flush()
        with self._lock:
            usage = {r[0]: Usage(*r[1:]) for r in self._db.execute(
                "SELECT name, requests, prompt_tokens, completion_tokens, errors, last_used FROM usage")}
            recs = self._records()
        now = time.time()
        return [KeyInfo(r.name, r.hint, r.scope, r.status(now), r.created, r.expires, r.revoked, usage.get(r.name, Usage()),
                        r.max_tokens) for r in recs]

    # -- usage and activity (buffered in memory, written by flush(): one short transaction a second) ---
    def record(self, rec: ActivityRecord, error: bool) -> None:
        with self._buf_lock:
            p = self._pending.setdefault(rec.key_name, _Pending())
            p.requests += 1
            p.prompt_tokens += rec.prompt_tokens or 0
            p.completion_tokens += rec.completion_tokens or 0
            p.errors += 1 if error else 0
            p.last_used = rec.time
            self._activity.append(rec)

    def count_error(self, name: str) -> None:
        """One more error for `name`, without an activity row (a refusal past the activity's rate)."""
        with self._buf_lock:
            p = self._pending.setdefault(name, _Pending())
            p.requests += 1
            p.errors += 1
            p.last_used = time.time()

    def flush(self) -> None:
        with self._flush_lock:  # a second flush (a reader's) waits until the first one's rows are written
            self._write(*self._take_buffer())

    def _take_buffer(self) -> tuple[dict[str, _Pending], list[ActivityRecord]]:
        with self._buf_lock:
            pending, self._pending = self._pending, {}
            activity, self._activity = self._activity, []
        return pending, activity

    def _write(self, pending: dict[str, _Pending], activity: list[ActivityRecord]) -> None:
        if not pending and not activity:
            return
        with self._lock:
            for name, p in pending.items():
                self._db.execute("INSERT OR IGNORE INTO usage (name) VALUES (?)", (name,))
                self._db.execute(
                    "UPDATE usage SET requests=requests+?, prompt_tokens=prompt_tokens+?, "
                    "completion_tokens=completion_tokens+?, errors=errors+?, last_used=MAX(COALESCE(last_used, 0), ?) "
                    "WHERE name=?", (p.requests, p.prompt_tokens, p.completion_tokens, p.errors, p.last_used, name))
            self._db.executemany(
                "INSERT INTO activity (time, key_name, route, status, prompt_tokens, completion_tokens, ttft_s, "
                "duration_s, tok_s, error, request_body, response_body) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                [(a.time, a.key_name, a.route, a.status, a.prompt_tokens, a.completion_tokens, a.ttft_s, a.duration_s,
                  a.tok_s, a.error, a.request_body, a.response_body) for a in activity])
            self._db.execute("DELETE FROM activity WHERE id <= (SELECT MAX(id) FROM activity) - ?", (ACTIVITY_KEEP,))
            self._db.commit()

    def activity(self, limit: int = 100) -> list[ActivityRecord]:
        """The most recent requests, newest first (flushed ones from disk, so another process's too)."""
        self.flush()
        with self._lock:
            rows = self._db.execute(
                "SELECT time, key_name, route, status, prompt_tokens, completion_tokens, ttft_s, duration_s, tok_s, "
                "error, request_body, response_body FROM activity ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [ActivityRecord(*r) for r in rows]
