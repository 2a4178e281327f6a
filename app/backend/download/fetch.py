"""One ranged fetch of `[start, end)` of a part into its staging file, with resume and backoff.

Retries (tenacity) cover dropped/reset connections, short bodies, 5xx, 429 (waiting what the server
asks) and stalls (no byte for `stall_s`: ranged.py's watchdog, not a total timeout). Every retry
resumes at the first missing byte with `Range`. A server that ignores Range and answers 200 is read
from the start and the bytes before our offset are discarded.
The attempt counter resets whenever bytes arrive, so a slow but moving link never gives up.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Callable

from tenacity import RetryCallState, Retrying, retry_if_exception

from app.backend.download.hub import HubClient, is_transient, make_wait, raise_for_hub_status
from app.backend.download.ranged import RangeGetter, Reply, StallError
from app.backend.download.types import DownloadConfig, DownloadError, PartInfo, Stopped, TransientError

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class _NoProgressStop:
    """tenacity stop rule: give up after `limit` consecutive attempts that moved no byte."""

    def __init__(self, limit: int, pos: Callable[[], int]) -> None:
        self.limit, self.pos, self.last, self.count = limit, pos, pos(), 0

    def __call__(self, retry_state: RetryCallState) -> bool:
        now = self.pos()
        if now != self.last:
            self.last, self.count = now, 0
        self.count += 1
        return self.count >= self.limit


def fetch_range(hub: HubClient, getter: RangeGetter, part: PartInfo, start: int, end: int, fd: int,
                stop: threading.Event,
                on_wire: Callable[[int], None], on_useful: Callable[[int], None],
                on_retry: Callable[[str], None], between: Callable[[float], None] | None = None) -> None:
    """Write bytes [start, end) of `part` at the same offsets of fd. Raises Stopped / DownloadError.

    `between(seconds)` waits before a retry (raising Stopped); without it the wait is on `stop`."""
    cfg: DownloadConfig = hub.cfg
    pos = [start]

    def sleep(seconds: float) -> None:
        if between is not None:
            between(seconds)
        elif stop.wait(seconds):
            raise Stopped()

    def before_sleep(retry_state: RetryCallState) -> None:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        on_retry(f"{type(exc).__name__}: {exc}")

    retrying = Retrying(stop=_NoProgressStop(cfg.attempts_without_progress, lambda: pos[0]),
                        wait=make_wait(cfg), retry=retry_if_exception(is_transient), sleep=sleep,
                        before_sleep=before_sleep, reraise=True)
    try:
        for attempt in retrying:
            with attempt:
                _one_request(hub, getter, part, pos, end, fd, stop, on_wire, on_useful)
    except (Stopped, DownloadError):
        raise
    except Exception as exc:
        if not is_transient(exc):
            raise
        raise DownloadError(f"part {part.name}: gave up after {cfg.attempts_without_progress} attempts without "
                            f"progress ({type(exc).__name__}: {exc}); check the network/endpoint and Resume — "
                            "verified data is kept") from None


class _Staging:
    """Body pieces (ranged.BODY_BUFFER at most) -> the part's staging file at their offsets.

    `pos[0]` counts only bytes on disk; the wire counter also counts bytes dropped before our offset.
    """

    def __init__(self, fd: int, pos: list[int], on_wire: Callable[[int], None], on_useful: Callable[[int], None]) -> None:
        self.fd, self.pos, self.on_wire, self.on_useful = fd, pos, on_wire, on_useful

    def add(self, view: memoryview, wire: int) -> None:
        if view:
            useful = len(view)
            while view:
                k = os.pwrite(self.fd, view, self.pos[0])
                view = view[k:]
                self.pos[0] += k
            self.on_useful(useful)
        if wire:
            self.on_wire(wire)


class _Status:
    """libcurl's answer in the shape raise_for_hub_status reads (status_code, headers)."""

    def __init__(self, status: int, headers: dict[str, str]) -> None:
        self.status_code, self.headers = status, headers


class _Done(Exception):
    """The wanted range is in: stop reading (a server that ignored Range would send the whole file)."""


def _one_request(hub: HubClient, getter: RangeGetter, part: PartInfo, pos: list[int], end: int, fd: int,
                 stop: threading.Event, on_wire: Callable[[int], None], on_useful: Callable[[int], None]) -> None:
    if stop.is_set():
        raise Stopped()
    if pos[0] >= end:  # every byte arrived before the last attempt ended as a retry (e.g. a late stall flag)
        return
    res = hub.resolve(part.name)
    skip: list[int | None] = [None]  # bytes to drop before ours; None until the first body chunk
    out = _Staging(fd, pos, on_wire, on_useful)

    def on_body(reply: Reply, piece: memoryview) -> None:
        if skip[0] is None:
            skip[0] = 0
            if reply.status == 206:
                m = _CONTENT_RANGE.match(reply.headers.get("content-range", ""))
                if not m or int(m.group(1)) != pos[0]:
                    raise TransientError(f"{part.name}: server answered range {reply.headers.get('content-range')!r} "
                                         f"for bytes={pos[0]}-")
            else:
                skip[0] = pos[0]  # Range ignored (200): the body starts at byte 0
        view = piece
        if skip[0]:
            drop = min(skip[0], len(view))
            view, skip[0] = view[drop:], skip[0] - drop
        out.add(view[: end - pos[0]], len(piece))
        if pos[0] >= end:
            raise _Done()

    headers = {"Range": f"bytes={pos[0]}-{end - 1}", "Accept-Encoding": "identity", **hub.headers_for(res.location)}
    reply = getter.get(res.location, headers, on_body, stop.is_set)  # whatever arrived before a drop is kept
    if isinstance(reply.aborted, _Done):
        return
    if isinstance(reply.aborted, StallError):
        raise TransientError(f"{part.name}: {reply.aborted}")
    if reply.aborted is not None:
        raise reply.aborted  # Stopped, a bad Content-Range, or a disk error from pwrite
    if reply.status in (401, 403, 404, 410) or 300 <= reply.status < 400:
        hub.forget(part.name)  # expired/invalid signed URL (or a CDN redirect, never followed): resolve again
        raise TransientError(f"{part.name}: {hub.where(res)} answered HTTP {reply.status}; "
                             "resolving the file again")
    if reply.status and not 200 <= reply.status < 300:
        raise_for_hub_status(_Status(reply.status, reply.headers), hub.cfg, part.name, res.location)
        raise TransientError(f"{part.name}: unexpected HTTP {reply.status} from {hub.where(res)}")
    if reply.transport_error:
        raise TransientError(f"{part.name}: {reply.transport_error}")
    if pos[0] < end:
        raise TransientError(f"{part.name}: connection ended early at byte {pos[0]} (wanted up to {end})")
