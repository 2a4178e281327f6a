"""A SIMULATED Hugging Face Hub on 127.0.0.1, close enough to the real API to test a downloader.

Endpoints (the Hub's own, docs/downloads.md#the-hub), checked by the real `huggingface_hub` client in tests/download/test_hub_client.py:
  GET /api/models/{owner}/{name}[/revision/{rev}][?blobs=true]  model_info: `sha` + siblings (size, lfs.sha256)
  GET /api/models/{owner}/{name}/tree/{rev}?recursive=true   JSON array, paged with `Link: <..>; rel="next"`
  GET|HEAD /{owner}/{name}/resolve/{rev}/{path}              302 to the CDN with X-Repo-Commit,
                                                             X-Linked-Etag, X-Linked-Size
  GET|HEAD /cdn/{owner}/{name}/{commit}/{path}               the bytes: Range -> 206 + Content-Range, ETag;
                                                             served on a second port (`cdn_endpoint`), another
                                                             origin as on the real Hub (cdn-lfs.hf.co)
Errors as the Hub sends them (X-Error-Code / X-Error-Message, which hf_raise_for_status reads): a private
hub (`token=`) answers 401 RepoNotFound without a token and 401 "Invalid credentials" for a wrong one;
a gated repo lists publicly but its files answer 401 GatedRepo without a token, 403 GatedRepo for a
token not granted; unknown repo / revision / file: 404 RepoNotFound / RevisionNotFound / EntryNotFound.
Faults: see faults.py. Optional caps (pacing.py): per connection, and a link shared by all.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import struct
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

from app.backend.simhub.faults import Fault, FaultBook
from app.backend.simhub.pacing import Pacer, step_for, take_all

CHUNK = 1 << 20
RECORDS = 100_000  # timing records kept (HubStats.bodies, .seen): a bench run of 4.5 GiB makes ~1,000


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

    requests: Counter[tuple[str, str]] = field(default_factory=Counter)  # (where, path) -> count
    cdn_bytes: Counter[str] = field(default_factory=Counter)  # path -> body bytes sent
    ranges: list[tuple[str, str]] = field(default_factory=list)  # (path, Range header)
    # The benchmark's timing records, the last RECORDS of each (the demo hub runs as long as the panel):
    # (path, first byte, bytes sent, began, ended: time.monotonic()) per body: when each range was served
    bodies: deque[tuple[str, int, int, float, float]] = field(default_factory=lambda: deque(maxlen=RECORDS))
    # (arrived: time.monotonic(), method, path) per request: when a client's start-up steps reached the hub
    seen: deque[tuple[float, str, str]] = field(default_factory=lambda: deque(maxlen=RECORDS))
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
                 token: str | None = None, rate_cap_bps: float | None = None,
                 link_cap_bps: float | None = None) -> None:
        self.page_size = page_size
        self.token = token
        self.rate_cap_bps = rate_cap_bps  # per connection, read at each request (tests lift it mid-run)
        self.link = Pacer(link_cap_bps) if link_cap_bps else None  # one link shared by every connection
        self.repos: dict[str, HubRepo] = {}
        self.faults = FaultBook()
        self.stats = HubStats()
        self._stopping = threading.Event()
        self._httpd = _QuietServer((host, port), _make_handler(self))
        self._httpd.daemon_threads = True
        self._cdn_httpd = _QuietServer((host, 0), _make_handler(self))
        self._cdn_httpd.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def endpoint(self) -> str:
        host, port = self._httpd.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    @property
    def cdn_endpoint(self) -> str:
        host, port = self._cdn_httpd.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def rename_repo(self, old: str, new: str) -> Fault:
        """The repo `new` is also reachable under `old`, as the Hub does after a rename (307, relative)."""
        return self.faults.add(old, Fault("renamed", where="repo", target=new, times=-1))

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

    def start(self) -> SimHub:
        """Idempotent: `with hub.start():` enters a started hub. A second serve_forever per server
        would outlive stop() (one shutdown() ends one loop) and spin on the closed socket."""
        if self._threads:
            return self
        for name, server in (("simhub", self._httpd), ("simhub-cdn", self._cdn_httpd)):
            # stop() waits for serve_forever's next poll: 0.05 s, not the default 0.5 s (as the sim engine)
            t = threading.Thread(target=server.serve_forever, args=(0.05,), name=name, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stopping.set()
        for server in (self._httpd, self._cdn_httpd):
            if self._threads:
                server.shutdown()
            server.server_close()

    def __enter__(self) -> SimHub:
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
    # TCP_NODELAY, as a real Hub's front ends have: without it Nagle held each answer's body (and a
    # range's last bytes) behind the headers until the client's delayed ACK, ~40 ms: the listing took
    # 41-62 ms on loopback, a HEAD up to 145 ms; with it 3-4 ms (docs/downloads.md, "The hub's caps")
    disable_nagle_algorithm = True

    def log_message(self, fmt: str, *args: object) -> None:  # quiet: tests read counters instead
        pass

    # ---- routing -------------------------------------------------------------------------------
    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        with self.hub.stats.lock:
            self.hub.stats.seen.append((time.monotonic(), self.command, url.path))
        parts = url.path.split("/")
        try:
            if self._renamed(url.path, url.query, parts):
                return
            if url.path.startswith("/api/models/") and len(parts) >= 7 and parts[5] == "tree":
                self._tree(f"{parts[3]}/{parts[4]}", unquote(parts[6]), parse_qs(url.query))
            elif url.path.startswith("/api/models/") and (len(parts) == 5 or len(parts) == 7 and parts[5] == "revision"):
                self._info(f"{parts[3]}/{parts[4]}", unquote(parts[6]) if len(parts) == 7 else "main",
                           parse_qs(url.query))
            elif len(parts) >= 6 and parts[3] == "resolve":
                self._resolve(f"{parts[1]}/{parts[2]}", unquote(parts[4]), unquote("/".join(parts[5:])), head)
            elif (url.path.startswith("/cdn/") or url.path.startswith("/cas-bridge/")) and len(parts) >= 6:
                self._cdn(f"{parts[2]}/{parts[3]}", parts[4], unquote("/".join(parts[5:])), head)
            else:
                self._error(404, "EntryNotFound", "not found")
        except (BrokenPipeError, ConnectionResetError):
            pass

    # ---- helpers -------------------------------------------------------------------------------
    def _renamed(self, path: str, query: str, parts: list[str]) -> bool:
        """A renamed repo: 307 with a relative Location under the new name (the Hub's answer)."""
        if path.startswith("/api/models/") and len(parts) >= 5:
            i = 3
        elif len(parts) >= 4 and parts[3] == "resolve":
            i = 1
        else:
            return False
        fault = self.hub.faults.take(f"{parts[i]}/{parts[i + 1]}", "repo")
        if fault is None or fault.kind != "renamed":
            return False
        new = parts[:i] + fault.target.split("/") + parts[i + 2:]
        self._count("renamed", f"{parts[i]}/{parts[i + 1]}")
        self._redirect(307, "/".join(new) + (f"?{query}" if query else ""))
        return True

    def _redirect(self, status: int, location: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Location", location)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _error(self, status: int, code: str, message: str, extra: dict[str, str] | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _count(self, where: str, path: str) -> None:
        with self.hub.stats.lock:
            self.hub.stats.requests[(where, path)] += 1

    def _check_repo(self, repo: str, rev: str, files: bool = True) -> HubRepo | None:
        """Auth, then repo/revision lookup. Sends the error response and returns None on failure.

        `files=False` (listings): a gated repo's metadata is public, as on the Hub; its files are not.
        """
        auth = self.headers.get("Authorization", "")
        with self.hub.stats.lock:
            self.hub.stats.auth_headers.append(auth)
        given = auth[7:] if auth.startswith("Bearer ") else None
        if self.hub.token and given and given != self.hub.token:
            self._error(401, "", "Invalid credentials in Authorization header")
            return None
        if self.hub.token and not given:  # the Hub does not tell private from missing without a token
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        hub_repo = self.hub.repos.get(repo)
        if hub_repo is None:
            self._error(404, "RepoNotFound", f"Repository {repo} not found")
            return None
        if files and hub_repo.gated and given not in hub_repo.granted_tokens:
            if not given:
                self._error(401, "GatedRepo", f"Access to model {repo} is restricted. You must be authenticated "
                                              "to access it.")
            else:
                self._error(403, "GatedRepo", f"Access to model {repo} is restricted and you are not in the "
                                              f"authorized list. Visit {self.hub.endpoint}/{repo} to ask for access.")
            return None
        if rev not in ("main", hub_repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return hub_repo

    def _maybe_api_fault(self, where: str, path: str) -> bool:
        fault = self.hub.faults.take(path, where, kinds=("status", "ratelimit"))
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
        hub_repo = self._check_repo(repo, rev, files=False)
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

    def _info(self, repo: str, rev: str, query: dict[str, list[str]]) -> None:
        """model_info: the commit and, with ?blobs=true, each file's size and LFS sha256 (one answer)."""
        self._count("info", repo)
        hub_repo = self._check_repo(repo, rev, files=False)
        if hub_repo is None:
            return
        fault = self.hub.faults.take("__info__", "info")
        if fault is not None and fault.kind in ("status", "ratelimit"):
            self._send_fault_status(fault)
            return
        if fault is not None and fault.kind == "redirect":
            self._redirect(302, fault.target, fault.headers)
            return
        if fault is not None and fault.kind == "huge_listing":
            self._huge_listing(hub_repo, fault.count)
            return
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = []
        for f in hub_repo.files.values():
            sib: dict[str, object] = {"rfilename": f.path}
            if blobs:
                sib.update(size=f.size, blobId=_blob_id(f))
                if f.lfs:
                    sib["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": 134}
            siblings.append(sib)
        info = {"_id": fake_commit(repo)[:24], "id": repo, "modelId": repo, "sha": hub_repo.commit,
                "private": bool(self.hub.token), "gated": "manual" if hub_repo.gated else False,
                "disabled": False, "downloads": 0, "likes": 0, "tags": ["simulated"],
                "lastModified": "2026-01-01T00:00:00.000Z", "createdAt": "2026-01-01T00:00:00.000Z",
                "siblings": siblings}
        body = fault.body if fault is not None and fault.kind == "body" else json.dumps(info).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (fault.headers if fault is not None else {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _huge_listing(self, hub_repo: HubRepo, count: int) -> None:
        """A listing streamed without Content-Length (close-delimited): only a byte cap stops a client."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        head = json.dumps({"id": hub_repo.repo, "sha": hub_repo.commit})[:-1] + ', "siblings": ['
        self.wfile.write(head.encode())
        entry = ('{"rfilename": "planescache.tar.zst.part.%07d", "size": 1, "lfs": {"sha256": "%s", '
                 '"size": 1, "pointerSize": 134}}')
        sha = "0" * 64
        batch = 1000
        for start in range(0, count, batch):
            if self.hub._stopping.is_set():
                return
            chunk = ",".join(entry % (i, sha) for i in range(start, min(start + batch, count)))
            self.wfile.write(((", " if start else "") + chunk).encode())
        self.wfile.write(b"]}")

    def _resolve(self, repo: str, rev: str, path: str, head: bool) -> None:
        self._count("resolve", path)
        hub_repo = self._check_repo(repo, rev)
        if hub_repo is None or self._maybe_api_fault("resolve", path):
            return
        f = hub_repo.files.get(path)
        if f is None:
            self._error(404, "EntryNotFound", f"{path} does not exist on {rev}")
            return
        fault = self.hub.faults.take(path, "resolve", kinds=("redirect", "no_etag", "no_commit", "xet"))
        kind = fault.kind if fault is not None else ""
        if kind == "redirect":
            assert fault is not None
            self._redirect(302, fault.target, {"X-Repo-Commit": hub_repo.commit, **fault.headers})
            return
        where = "cas-bridge" if kind == "xet" else "cdn"
        self.send_response(302)
        self.send_header("Location", f"{self.hub.cdn_endpoint}/{where}/{repo}/{hub_repo.commit}/{quote(path)}")
        if kind != "no_commit":
            self.send_header("X-Repo-Commit", hub_repo.commit)
        if kind != "no_etag":
            self.send_header("X-Linked-Etag", f'"{f.sha256}"')
            self.send_header("ETag", f'"{f.sha256}"')
        self.send_header("X-Linked-Size", str(f.size))
        if kind == "xet":
            xet_hash = hashlib.sha256(b"xet" + f.sha256.encode()).hexdigest()
            refresh = f"{self.hub.endpoint}/api/models/{repo}/xet-read-token/{hub_repo.commit}"
            self.send_header("X-Xet-Hash", xet_hash)
            self.send_header("X-Xet-Refresh-Route", refresh)
            self.send_header("Link", f'<{refresh}>; rel="xet-auth"')
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
            began = time.monotonic()
            self._send_body(f, start, length, fault)
            with self.hub.stats.lock:
                self.hub.stats.bodies.append((path, start, length, began, time.monotonic()))

    def _send_body(self, f: HubFile, start: int, length: int, fault: Fault | None) -> None:
        cap, link = self.hub.rate_cap_bps, self.hub.link
        cut = fault.after_bytes if fault and fault.kind in ("drop", "reset", "stall") else None
        with open(f.local, "rb") as fh:
            own = Pacer(cap) if cap else None
            paced = step_for(min(r for r in (cap, link and link.bps) if r)) if (own or link) else None
            if fault is None:  # zero-copy, in paced steps when capped
                step = paced or length
                sent = 0
                while sent < length:
                    want = min(step, length - sent)
                    take_all((own, link), want)
                    n = self.connection.sendfile(fh, start + sent, want)
                    if n == 0:
                        break
                    sent += n
                    self._add_bytes(f.path, n)  # per step: a test polling a capped body sees it move
                return
            fh.seek(start)
            step = paced or CHUNK
            sent = 0
            while sent < length:
                want = min(step, length - sent) if cut is None else min(step, length - sent, cut - sent)
                if want <= 0:
                    break
                data = fh.read(want)
                if fault and fault.kind == "corrupt" and start + sent <= fault.offset < start + sent + len(data):
                    i = fault.offset - start - sent
                    data = data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:]
                take_all((own, link), len(data))
                self.wfile.write(data)
                sent += len(data)
                self._add_bytes(f.path, len(data))  # counted as sent, so tests see exact totals
            self.wfile.flush()
        if cut is not None and fault is not None:
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


def _blob_id(f: HubFile) -> str:
    return hashlib.sha1(f"blob {f.size}\0{f.sha256}".encode()).hexdigest()


def _tree_entries(repo: HubRepo) -> list[dict[str, object]]:
    dirs: set[str] = set()
    entries: list[dict[str, object]] = []
    for f in repo.files.values():
        parent = f.path.rsplit("/", 1)[0] if "/" in f.path else ""
        while parent and parent not in dirs:
            dirs.add(parent)
            parent = parent.rsplit("/", 1)[0] if "/" in parent else ""
        entry: dict[str, object] = {"type": "file", "path": f.path, "size": f.size, "oid": _blob_id(f)}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": 134}
        entries.append(entry)
    entries += [{"type": "directory", "path": d, "size": 0, "oid": fake_commit(d)} for d in dirs]
    return sorted(entries, key=lambda e: str(e["path"]))
