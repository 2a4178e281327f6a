"""One ranged fetch of `[start, end)` of a part into its staging file, with resume and backoff.

Retries (tenacity) cover dropped/reset connections, short bodies, 5xx, 429 (waiting what the server
asks) and stalls (httpx's read timeout = no byte for `stall_s`: a per-read watchdog, not a total
timeout). Every retry resumes at the first missing byte with `Range`. A server that ignores Range
and answers 200 is read from the start and the bytes before our offset are discarded.
The attempt counter resets whenever bytes arrive, so a slow but moving link never gives up.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any, Callable

from tenacity import Retrying, retry_if_exception

from app.backend.download.hub import HubClient, is_transient, make_wait, raise_for_hub_status
from app.backend.download.types import DownloadConfig, DownloadError, PartInfo, Stopped, TransientError

READ_CHUNK = 512 * 1024
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class _NoProgressStop:
    """tenacity stop rule: give up after `limit` consecutive attempts that moved no byte."""

    def __init__(self, limit: int, pos: Callable[[], int]) -> None:
        self.limit, self.pos, self.last, self.count = limit, pos, pos(), 0

    def __call__(self, retry_state: Any) -> bool:
        now = self.pos()
        if now != self.last:
            self.last, self.count = now, 0
        self.count += 1
        return self.count >= self.limit


def fetch_range(hub: HubClient, part: PartInfo, start: int, end: int, fd: int, stop: threading.Event,
                on_wire: Callable[[int], None], on_useful: Callable[[int], None],
                on_retry: Callable[[str], None]) -> None:
    """Write bytes [start, end) of `part` at the same offsets of fd. Raises Stopped / DownloadError."""
    cfg: DownloadConfig = hub.cfg
    pos = [start]

    def sleep(seconds: float) -> None:
        if stop.wait(seconds):
            raise Stopped()

    def before_sleep(retry_state: Any) -> None:
        exc = retry_state.outcome.exception()
        on_retry(f"{type(exc).__name__}: {exc}")

    retrying = Retrying(stop=_NoProgressStop(cfg.attempts_without_progress, lambda: pos[0]),
                        wait=make_wait(cfg), retry=retry_if_exception(is_transient), sleep=sleep,
                        before_sleep=before_sleep, reraise=True)
    try:
        for attempt in retrying:
            with attempt:
                _one_request(hub, part, pos, end, fd, stop, on_wire, on_useful)
    except (Stopped, DownloadError):
        raise
    except Exception as exc:
        if not is_transient(exc):
            raise
        raise DownloadError(f"part {part.name}: gave up after {cfg.attempts_without_progress} attempts without "
                            f"progress ({type(exc).__name__}: {exc}); check the network/endpoint and Resume — "
                            "verified data is kept") from None


def _one_request(hub: HubClient, part: PartInfo, pos: list[int], end: int, fd: int, stop: threading.Event,
                 on_wire: Callable[[int], None], on_useful: Callable[[int], None]) -> None:
    if stop.is_set():
        raise Stopped()
    res = hub.resolve(part.name)
    headers = {"Range": f"bytes={pos[0]}-{end - 1}", **hub.headers_for(res.location)}
    with hub.http.stream("GET", res.location, headers=headers) as r:
        if r.status_code == 206:
            m = _CONTENT_RANGE.match(r.headers.get("Content-Range", ""))
            if not m or int(m.group(1)) != pos[0]:
                raise TransientError(f"{part.name}: server answered range {r.headers.get('Content-Range')!r} "
                                     f"for bytes={pos[0]}-")
            skip = 0
        elif r.status_code == 200:
            skip = pos[0]  # Range ignored: the body starts at byte 0
        elif r.status_code in (401, 403, 404, 410):
            hub.forget(part.name)  # expired/invalid signed URL: resolve again next attempt
            raise TransientError(f"{part.name}: download URL answered {r.status_code}; resolving it again")
        else:
            raise_for_hub_status(r, hub.cfg, part.name)
            raise TransientError(f"{part.name}: unexpected HTTP {r.status_code}")
        for chunk in r.iter_raw():  # unbuffered: bytes read before a drop are kept
            on_wire(len(chunk))
            if skip:
                drop = min(skip, len(chunk))
                chunk, skip = chunk[drop:], skip - drop
                if not chunk:
                    continue
            chunk = chunk[: end - pos[0]]
            view = memoryview(chunk)
            while view:
                n = os.pwrite(fd, view, pos[0])
                view = view[n:]
                pos[0] += n
            on_useful(len(chunk))
            if pos[0] >= end:
                break
            if stop.is_set():
                raise Stopped()
    if pos[0] < end:
        raise TransientError(f"{part.name}: connection ended early at byte {pos[0]} (wanted up to {end})")
