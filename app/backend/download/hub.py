"""Talking to the Hub (or a mirror / the SIMULATED hub): tree listing, resolve, ranged reads.

* Tree: follows `Link: rel="next"` pages; API calls retried with tenacity, honouring `Retry-After` and
  the `RateLimit: ...;t=<s>` reset.
* Resolve: HEAD without following the redirect; pins the commit (`X-Repo-Commit`) and keeps the
  CDN `Location`. The token goes to the Hub only, never to the CDN host.
* 401/403/404 become AuthError/NotFoundError with what to do next.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import quote

import httpx
from tenacity import Retrying, retry_if_exception, stop_after_attempt

from app.backend.download.types import AuthError, DownloadConfig, DownloadError, NotFoundError, TransientError

RETRY_STATUSES = {408, 429, 500, 502, 503, 504}
LOCATION_TTL_S = 600.0  # signed CDN URLs expire (~1 h on the Hub); re-resolve well before


@dataclass(frozen=True)
class TreeEntry:
    path: str
    size: int
    sha256: str | None  # lfs.oid; None for small non-LFS files


@dataclass(frozen=True)
class Resolved:
    commit: str
    location: str
    size: int
    etag: str
    at: float


def retry_after_of(resp: httpx.Response) -> float | None:
    """Seconds to wait from `RateLimit: "...";r=0;t=12` (preferred) or `Retry-After: 12`."""
    m = re.search(r"(?:^|;)\s*t=(\d+)", resp.headers.get("RateLimit", ""))
    if m:
        return float(m.group(1)) + (1.0 if re.search(r"r=0\b", resp.headers["RateLimit"]) else 0.0)
    ra = resp.headers.get("Retry-After", "")
    return float(ra) if ra.strip().isdigit() else None


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, (TransientError, httpx.TransportError))


def make_wait(cfg: DownloadConfig) -> Callable[[Any], float]:
    """Exponential backoff (base·2^n, capped), or exactly what the server asked for."""

    def wait(retry_state: Any) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, TransientError) and exc.retry_after is not None:
            return min(exc.retry_after, 300.0)
        return min(cfg.backoff_max_s, cfg.backoff_base_s * 2 ** (retry_state.attempt_number - 1))

    return wait


def raise_for_hub_status(resp: httpx.Response, cfg: DownloadConfig, what: str) -> None:
    """Map an error status to an actionable exception (token never included)."""
    s = resp.status_code
    code = resp.headers.get("X-Error-Code", "")
    where = f"{cfg.repo} at {cfg.endpoint}"
    if s == 401:
        hint = ("the token was rejected: check it (huggingface.co/settings/tokens) and save it again"
                if cfg.token else "this repo needs a token: set HF_TOKEN, use --token-file, or paste it in the Downloads tab")
        raise AuthError(f"401 Unauthorized for {what} in {where}: {hint}")
    if s == 403:
        raise AuthError(f"403 Forbidden for {what} in {where}: the repo is gated or private; accept its terms on "
                        f"the Hub with the account that owns the token, or use a token with read access")
    if s == 404:
        if code == "RevisionNotFound":
            raise NotFoundError(f"revision {cfg.revision!r} not found in {where}: check --revision")
        if code == "EntryNotFound":
            raise NotFoundError(f"{what} not found in {where} (revision {cfg.revision})")
        raise NotFoundError(f"repository {cfg.repo!r} not found at {cfg.endpoint}: check --repo/--endpoint "
                            f"(a private repo also answers 404 without a valid token)")
    if s in RETRY_STATUSES:
        raise TransientError(f"HTTP {s} for {what}", retry_after_of(resp))
    if s >= 400:
        raise DownloadError(f"HTTP {s} for {what} from {cfg.endpoint}")


class HubClient:
    def __init__(self, cfg: DownloadConfig, sleep: Callable[[float], Any] = time.sleep) -> None:
        self.cfg = cfg
        self._sleep = sleep
        timeout = httpx.Timeout(connect=cfg.connect_timeout_s, read=cfg.stall_s, write=30.0, pool=None)
        limits = httpx.Limits(max_connections=cfg.connections + 4, max_keepalive_connections=cfg.connections + 4)
        self.http = httpx.Client(timeout=timeout, limits=limits, follow_redirects=False,
                                 headers={"User-Agent": "moet-panel/0.1", "Accept-Encoding": "identity"})
        self._locations: dict[str, Resolved] = {}
        self._lock = threading.Lock()
        self._resolve_lock = threading.Lock()  # one HEAD per part even when workers race for it
        self.commit: str | None = None

    def close(self) -> None:
        self.http.close()

    def _auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.cfg.token}"} if self.cfg.token else {}

    def _retrying(self) -> Callable[..., Any]:
        retrying = Retrying(stop=stop_after_attempt(self.cfg.api_attempts), wait=make_wait(self.cfg),
                            retry=retry_if_exception(is_transient), reraise=True, sleep=self._sleep)

        def call(fn: Callable[..., Any], *args: Any) -> Any:
            try:
                return retrying(fn, *args)
            except (httpx.TransportError, TransientError) as exc:
                raise DownloadError(f"cannot reach the Hub at {self.cfg.endpoint} after {self.cfg.api_attempts} "
                                    f"attempts ({type(exc).__name__}: {exc}); check --endpoint and the network, "
                                    "then retry") from None

        return call

    # ---- tree ----------------------------------------------------------------------------------
    def list_files(self, revision: str | None = None) -> list[TreeEntry]:
        rev = quote(revision or self.cfg.revision, safe="")
        url: str | None = f"{self.cfg.endpoint}/api/models/{self.cfg.repo}/tree/{rev}?recursive=true&expand=false"
        out: list[TreeEntry] = []
        while url:
            resp = self._retrying()(self._get_page, url)
            for e in resp.json():
                if e.get("type") == "file":
                    lfs = e.get("lfs") or {}
                    out.append(TreeEntry(e["path"], int(e.get("size", 0)), lfs.get("oid")))
            url = resp.links.get("next", {}).get("url")
        return out

    def _get_page(self, url: str) -> httpx.Response:
        resp = self.http.get(url, headers=self._auth())
        raise_for_hub_status(resp, self.cfg, "the file listing")
        return resp

    # ---- resolve -------------------------------------------------------------------------------
    def resolve(self, path: str, revision: str | None = None, fresh: bool = False) -> Resolved:
        """HEAD /resolve/ without following the redirect; cached for LOCATION_TTL_S."""
        rev = revision or self.commit or self.cfg.revision
        with self._resolve_lock:
            with self._lock:
                hit = self._locations.get(path)
            if hit and not fresh and time.monotonic() - hit.at < LOCATION_TTL_S:
                return hit
            resolved = self._retrying()(self._head, path, rev)
            with self._lock:
                self._locations[path] = resolved
            return resolved

    def forget(self, path: str) -> None:
        with self._lock:
            self._locations.pop(path, None)

    def _head(self, path: str, rev: str) -> Resolved:
        url = f"{self.cfg.endpoint}/{self.cfg.repo}/resolve/{quote(rev, safe='')}/{quote(path)}"
        resp = self.http.head(url, headers=self._auth())
        if resp.status_code in (301, 302, 303, 307, 308):
            location = str(resp.url.join(resp.headers["Location"]))
        elif resp.status_code == 200:  # served directly (small files / some mirrors)
            location = url
        else:
            raise_for_hub_status(resp, self.cfg, path)
            raise DownloadError(f"unexpected HTTP {resp.status_code} resolving {path}")
        etag = resp.headers.get("X-Linked-Etag") or resp.headers.get("ETag", "")
        size = resp.headers.get("X-Linked-Size") or resp.headers.get("Content-Length") or "0"
        return Resolved(commit=resp.headers.get("X-Repo-Commit", ""), location=location, size=int(size),
                        etag=etag.strip('"').removeprefix("W/").strip('"'), at=time.monotonic())

    def headers_for(self, location: str) -> dict[str, str]:
        """Auth only when the Hub serves the file itself (/resolve/ answered 200); never for a redirect target."""
        own = location.startswith(self.cfg.endpoint + "/") and "/resolve/" in location
        return self._auth() if own else {}
