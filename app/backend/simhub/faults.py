"""Fault injection for the SIMULATED Hub: what can go wrong on a real CDN, counted and per path."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Literal

FaultKind = Literal[
    "drop",  # send `after_bytes` of the body, then close the connection (FIN)
    "reset",  # send `after_bytes`, then RST (SO_LINGER 0)
    "truncate",  # honest headers for a shorter body: Content-Length = after_bytes
    "status",  # answer `status` (e.g. 503) instead of the file
    "ratelimit",  # 429 with Retry-After and the Hub's RateLimit headers
    "stall",  # send `after_bytes`, then nothing for `stall_s` seconds, then close
    "corrupt",  # flip the byte at file offset `offset` whenever it is served
    "ignore_range",  # answer 200 with the whole file to a Range request
    # Hub semantics (key: the repo name for "renamed", the file path or "*" for resolve, "__info__" for info)
    "renamed",  # the repo moved to `target`: every URL under the old name answers 307 with a relative Location
    "no_etag",  # resolve's 302 to the CDN carries neither ETag nor X-Linked-Etag
    "no_commit",  # resolve answers without X-Repo-Commit
    "xet",  # resolve answers like a Xet-stored file: 302 to the Xet bridge (/cas-bridge/) with X-Xet-Hash
    "redirect",  # answer 302 with `Location: target` (hostile hub: dict://, file://, another host...)
    "body",  # answer 200 with `body` as the JSON (hostile listing: wrong types, bad names, a Link loop)
    "huge_listing",  # stream a listing of `count` siblings without Content-Length (hostile: memory)
]


@dataclass
class Fault:
    kind: FaultKind
    times: int = 1  # how many requests it hits; -1 = forever
    after_bytes: int = 0
    status: int = 503
    retry_after: int = 1
    stall_s: float = 30.0
    offset: int = 0
    where: Literal["cdn", "resolve", "tree", "info", "repo"] = "cdn"
    target: str = ""  # "renamed": the new repo name; "redirect": the Location
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)  # extra headers for "body"/"redirect"
    count: int = 0  # "huge_listing": how many entries
    covering: int | None = None  # any kind: only responses whose range includes this file offset
    hits: int = 0


@dataclass
class FaultBook:
    """Faults keyed by repo file path ("*" = any file; "__tree__" / "__info__" for the listings; the repo
    name for "renamed"). Thread-safe."""

    _faults: dict[str, list[Fault]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, path: str, fault: Fault) -> Fault:
        with self._lock:
            self._faults.setdefault(path, []).append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def take(self, path: str, where: str, covers: tuple[int, int] | None = None,
             kinds: tuple[str, ...] | None = None) -> Fault | None:
        """Consume and return the first armed fault for this request, or None.

        `covers` (start, end-exclusive) limits "corrupt" faults to responses that include the offset, and
        any fault with `covering` to responses that include that one;
        `kinds` limits the search to those kinds (each handler takes the kinds it plays).
        """
        with self._lock:
            for key in (path, "*"):
                for fault in self._faults.get(key, []):
                    if fault.where != where or fault.times == 0 or (kinds and fault.kind not in kinds):
                        continue
                    if fault.kind == "corrupt" and covers and not covers[0] <= fault.offset < covers[1]:
                        continue
                    if fault.covering is not None and covers and not covers[0] <= fault.covering < covers[1]:
                        continue
                    if fault.times > 0:
                        fault.times -= 1
                    fault.hits += 1
                    return fault
        return None
