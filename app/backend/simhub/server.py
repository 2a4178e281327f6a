"""A SIMULATED Hugging Face Hub on 127.0.0.1, close enough to the real API to test a downloader.

Endpoints (stack.md §2):
  GET /api/models/{owner}/{name}/tree/{rev}?recursive=true   JSON array, paged with `Link: <..>; rel="next"`
  GET|HEAD /{owner}/{name}/resolve/{rev}/{path}              302 to /cdn/... with X-Repo-Commit,
                                                             X-Linked-Etag, X-Linked-Size
  GET|HEAD /cdn/{owner}/{name}/{commit}/{path}               the bytes: Range -> 206 + Content-Range, ETag
Auth: an optional required bearer token (401 without / with a wrong one), gated repos (403), unknown
repo or revision (404 with X-Error-Code). Faults: see faults.py. Optional per-connection rate cap.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from app.backend.simhub.faults import Fault, FaultBook

CHUNK = 1 << 20


@dataclass
class HubFile:
    path: str
    local: Path
    size: int
    sha256: str
    lfs: bool = True


@dataclass
class HubRepo:
    repo: str
    commit: str
    files: dict[str, HubFile] = field(default_factory=dict)
    gated: bool = False
    granted_tokens: set[str] = field(default_factory=set)


@dataclass
class HubStats:
    """Request counters, so tests can prove what was (not) downloaded again."""

    requests: Counter = field(default_factory=Counter)  # (where, path) -> count
    cdn_bytes: Counter = field(default_factory=Counter)  # path -> body bytes sent
    ranges: list[tuple[str, str]] = field(default_factory=list)  # (path, Range header)
    auth_on_cdn: int = 0  # requests to /cdn/ that carried Authorization (must stay 0)
    auth_headers: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def cdn_requests(self, path: str) -> int:
        with self.lock:
            return self.requests[("cdn", path)]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK * 4):
            h.update(chunk)
    return h.hexdigest()


def fake_commit(seed: str) -> str:
    return hashlib.sha1(seed.encode()).hexdigest()


class SimHub:
    """Threaded Hub-like server. `start()` returns immediately; `endpoint` is its base URL."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, page_size: int = 1000,
                 token: str | None = None, rate_cap_bps: float | None = None) -> None:
        self.page_size = page_size
        self.token = token
        self.rate_cap_bps = rate_cap_bps
        self.repos: dict[str, HubRepo] = {}
        self.faults = FaultBook()
        self.stats = HubStats()
        self._stopping = threading.Event()
        self._httpd = _QuietServer((host, port), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def add_repo(self, repo: str, files: dict[str, Path], *, commit: str | None = None,
                 gated: bool = False) -> HubRepo:
        entries = {}
        for path, local in sorted(files.items()):
            size = local.stat().st_size
            entries[path] = HubFile(path, local, size, sha256_file(local), lfs=size >= 1024 or "part" in path)
        digest = hashlib.sha1("".join(f.sha256 for f in entries.values()).encode()).hexdigest()
        hub_repo = HubRepo(repo=repo, commit=commit or digest, files=entries, gated=gated)
        self.repos[repo] = hub_repo
        return hub_repo

    def add_fault(self, path: str, fault: Fault) -> Fault:
        return self.faults.add(path, fault)

    def start(self) -> "SimHub":
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="simhub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> "SimHub":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        pass  # clients dropping connections (faults, kill -9) are expected here


def _make_handler(hub: SimHub) -> type[BaseHTTPRequestHandler]:
    class Handler(_HubHandler):
        pass

    Handler.hub = hub
    return Handler


class _HubHandler(BaseHTTPRequestHandler):
    hub: SimHub
    protocol_version = "HTTP/1.1"
    server_version = "SimHub/1 (SIMULATED)"

    def log_message(self, fmt: str, *args: object) -> None:  # quiet: tests read counters instead
        pass

    # ---- routing -------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        parts = url.path.split("/")
        try:
            if url.path.startswith("/api/models/") and len(parts) >= 7 and parts[5] == "tree":
                self._tree(f"{parts[3]}/{parts[4]}", unquote(parts[6]), parse_qs(url.query))
            elif len(parts) >= 6 and parts[3] == "resolve":
                self._resolve(f"{parts[1]}/{parts[2]}", unquote(parts[4]), unquote("/".join(parts[5:])), head)
            elif url.path.startswith("/cdn/") and len(parts) >= 6:
                self._cdn(f"{parts[2]}/{parts[3]}", parts[4], unquote("/".join(parts[5:])), head)
            else:
                self._error(404, "EntryNotFound", "not found")
        except (BrokenPipeError, ConnectionResetError):
            pass

    # ---- helpers -------------------------------------------------------------------------------
    def _error(self, status: int, code: str, message: str, extra: dict[str, str] | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Error-Code", code)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _count(self, where: str, path: str) -> None:
        with self.hub.stats.lock:
            self.hub.stats.requests[(where, path)] += 1

    def _check_repo(self, repo: str, rev: str) -> HubRepo | None:
        """Auth, then repo/revision lookup. Sends the error response and returns None on failure."""
        auth = self.headers.get("Authorization", "")
        with self.hub.stats.lock:
            self.hub.stats.auth_headers.append(auth)
        given = auth[7:] if auth.startswith("Bearer ") else None
        if self.hub.token and given != self.hub.token:
            msg = "Invalid credentials in Authorization header" if given else "Authentication required"
            self._error(401, "Unauthorized", msg)
            return None
        hub_repo = self.hub.repos.get(repo)
        if hub_repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo} not found")
            return None
        if hub_repo.gated and given not in hub_repo.granted_tokens:
            self._error(403, "GatedRepo", f"Access to model {repo} is restricted. You must have access to it.")
            return None
        if rev not in ("main", hub_repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return hub_repo

    def _maybe_api_fault(self, where: str, path: str) -> bool:
        fault = self.hub.faults.take(path, where)
        if fault is None:
            return False
        self._send_fault_status(fault)
        return True

    def _send_fault_status(self, fault: Fault) -> None:
        if fault.kind == "ratelimit":
            self._error(429, "RateLimited", "rate limited", {
                "Retry-After": str(fault.retry_after),
                "RateLimit": f'"resolvers";r=0;t={fault.retry_after}',
                "RateLimit-Policy": '"fixed window";"resolvers";q=3000;w=300',
            })
        else:
            self._error(fault.status, "ServerError", f"simulated {fault.status}")

    # ---- endpoints -----------------------------------------------------------------------------
    def _tree(self, repo: str, rev: str, query: dict[str, list[str]]) -> None:
        self._count("tree", repo)
        hub_repo = self._check_repo(repo, rev)
        if hub_repo is None or self._maybe_api_fault("tree", "__tree__"):
            return
        entries = _tree_entries(hub_repo)
        start = int(query.get("cursor", ["0"])[0])
        page = entries[start:start + self.hub.page_size]
        body = json.dumps(page).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if start + self.hub.page_size < len(entries):
            nxt = f"{self.hub.endpoint}/api/models/{repo}/tree/{quote(rev, safe='')}?recursive=true&cursor={start + self.hub.page_size}"
            self.send_header("Link", f'<{nxt}>; rel="next"')
        self.end_headers()
        self.wfile.write(body)

    def _resolve(self, repo: str, rev: str, path: str, head: bool) -> None:
        self._count("resolve", path)
        hub_repo = self._check_repo(repo, rev)
        if hub_repo is None or self._maybe_api_fault("resolve", path):
            return
        f = hub_repo.files.get(path)
        if f is None:
            self._error(404, "EntryNotFound", f"{path} does not exist on {rev}")
            return
        self.send_response(302)
        self.send_header("Location", f"{self.hub.endpoint}/cdn/{repo}/{hub_repo.commit}/{quote(path)}")
        self.send_header("X-Repo-Commit", hub_repo.commit)
        self.send_header("X-Linked-Etag", f'"{f.sha256}"')
        self.send_header("X-Linked-Size", str(f.size))
        self.send_header("ETag", f'"{f.sha256}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _cdn(self, repo: str, commit: str, path: str, head: bool) -> None:
        self._count("cdn", path)
        if self.headers.get("Authorization"):
            with self.hub.stats.lock:
                self.hub.stats.auth_on_cdn += 1
        hub_repo = self.hub.repos.get(repo)
        f = hub_repo.files.get(path) if hub_repo and hub_repo.commit == commit else None
        if f is None:
            self._error(404, "EntryNotFound", "no such object")
            return
        rng = self.headers.get("Range")
        if rng:
            with self.hub.stats.lock:
                self.hub.stats.ranges.append((path, rng))
        start, end = _parse_range(rng, f.size)
        if start is None:
            self._error(416, "RangeNotSatisfiable", "bad range", {"Content-Range": f"bytes */{f.size}"})
            return
        fault = self.hub.faults.take(path, "cdn", (start, end))
        if fault and fault.kind in ("status", "ratelimit"):
            self._send_fault_status(fault)
            return
        partial = rng is not None and not (fault and fault.kind == "ignore_range")
        if not partial:
            start, end = 0, f.size
        length = end - start
        if fault and fault.kind == "truncate":
            length = min(length, fault.after_bytes)
        self.send_response(206 if partial else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("ETag", f'"{f.sha256}"')
        self.send_header("Accept-Ranges", "bytes")
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{f.size}")
        self.end_headers()
        if not head:
            self._send_body(f, start, length, fault)

    def _send_body(self, f: HubFile, start: int, length: int, fault: Fault | None) -> None:
        cap = self.hub.rate_cap_bps
        cut = fault.after_bytes if fault and fault.kind in ("drop", "reset", "stall") else None
        with open(f.local, "rb") as fh:
            if fault is None and not cap:  # fast path: zero-copy
                sent = 0
                while sent < length:
                    n = self.connection.sendfile(fh, start + sent, length - sent)
                    if n == 0:
                        break
                    sent += n
                self._add_bytes(f.path, sent)
                return
            fh.seek(start)
            sent, t0 = 0, time.monotonic()
            step = 64 * 1024 if cap else CHUNK
            while sent < length:
                want = min(step, length - sent) if cut is None else min(step, length - sent, cut - sent)
                if want <= 0:
                    break
                data = fh.read(want)
                if fault and fault.kind == "corrupt" and start + sent <= fault.offset < start + sent + len(data):
                    i = fault.offset - start - sent
                    data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
                self.wfile.write(data)
                sent += len(data)
                self._add_bytes(f.path, len(data))  # counted as sent, so tests see exact totals
                if cap:
                    delay = sent / cap - (time.monotonic() - t0)
                    if delay > 0:
                        time.sleep(delay)
            self.wfile.flush()
        if cut is not None:
            self._cut(fault)

    def _add_bytes(self, path: str, n: int) -> None:
        with self.hub.stats.lock:
            self.hub.stats.cdn_bytes[path] += n

    def _cut(self, fault: Fault) -> None:
        if fault.kind == "stall":
            self.hub._stopping.wait(fault.stall_s)
        if fault.kind == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.close_connection = True


def _parse_range(header: str | None, size: int) -> tuple[int | None, int]:
    """`bytes=a-b` / `bytes=a-` -> (start, end-exclusive); (None, 0) when unsatisfiable."""
    if not header:
        return 0, size
    m = re.fullmatch(r"bytes=(\d+)-(\d*)", header.strip())
    if not m:
        return 0, size
    start = int(m.group(1))
    end = min(int(m.group(2)) + 1, size) if m.group(2) else size
    if start >= size or end <= start:
        return None, 0
    return start, end


def _tree_entries(repo: HubRepo) -> list[dict]:
    dirs: set[str] = set()
    entries = []
    for f in repo.files.values():
        parent = f.path.rsplit("/", 1)[0] if "/" in f.path else ""
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = parent.rsplit("/", 1)[0] if "/" in parent else ""
        entry = {"type": "file", "path": f.path, "size": f.size,
                 "oid": hashlib.sha1(f"blob {f.size}\0{f.sha256}".encode()).hexdigest()}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
        entries.append(entry)
    entries += [{"type": "directory", "path": d, "size": 0, "oid": fake_commit(d)} for d in dirs]
    return sorted(entries, key=lambda e: e["path"])
