"""Talking to the Hub (or a mirror / the SIMULATED hub) through `huggingface_hub`, the Hub's reference client.

What goes through the library (docs/downloads.md "The Hub"):
* Listing + commit pinning: the Hub's model-info answer with `blobs=true` (what `HfApi.model_info(
  files_metadata=True)` sends) gives the commit (`sha`) and every file's size and LFS sha256 in one
  call, so the sha256s belong to the pinned commit; no paging. Sent as that method sends it: the
  library's shared client (`get_session`), its headers (`build_hf_headers`), its error mapping
  (`hf_raise_for_status`) and its repo-id rule (`validate_repo_id`); only `HfApi` itself is not
  imported: its module's imports sit on the critical path of every download start, in the panel's
  process and the artifact processes' forkserver alike (docs/downloads.md, "The Hub" and
  "Measurements behind the code").
* File metadata: `get_hf_file_metadata` (HEAD /resolve/, follows the Hub's own relative redirects, e.g. a
  renamed repo, and stops at the CDN / Xet bridge `Location`). A missing `X-Repo-Commit` is an error.
* Errors: `hf_raise_for_status`'s typed exceptions (GatedRepoError, RepositoryNotFoundError, ...) become
  the panel's actionable messages in `explain()`; the token never appears in them.

The bytes themselves go through ranged.py (libcurl), never through the library.

Trust boundaries (issue 13): every request the library makes for us passes `_guard_request` /
`_guard_response`, installed once through the public `set_client_factory`: http/https only (a `Location`
with any other scheme fails at once), the `Authorization` header only to the configured endpoint's
origin, and the listing body capped at MAX_LISTING_BYTES while it streams in. The guards act only inside
a `HubClient` call (a ContextVar), so other users of huggingface_hub in the process are left as they were.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, urljoin, urlsplit

import httpx2
import huggingface_hub
from huggingface_hub import constants, get_hf_file_metadata, get_session, hf_hub_url
from huggingface_hub.errors import (
    DisabledRepoError, EntryNotFoundError, GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
    HFValidationError, RepositoryNotFoundError, RevisionNotFoundError,
)
from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, validate_repo_id
from tenacity import RetryCallState, Retrying, retry_if_exception, stop_after_attempt

from app.backend.config import env
from app.backend.download.ranged import UnsafeUrlError
from app.backend.download.types import (
    AuthError, DownloadConfig, DownloadError, MiB, NotFoundError, TransientError,
)

log = logging.getLogger(__name__)

RETRY_STATUSES = {408, 429, 500, 502, 503, 504}
LOCATION_TTL_S = 600.0  # signed CDN URLs expire (~1 h on the Hub); re-resolve well before
ALLOWED_SCHEMES = ("http", "https")
MAX_LISTING_BYTES = 32 * MiB  # ~200k files with LFS info; 10^6 entries are refused after 32 MiB read
MAX_FILES = 100_000
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DEFAULT_PORTS = {"http": 80, "https": 443}


class OfflineError(DownloadError):
    kind = "offline"


@dataclass(frozen=True)
class TreeEntry:
    path: str
    size: int
    sha256: str | None  # lfs sha256; None for small non-LFS files


@dataclass(frozen=True)
class Resolved:
    commit: str
    location: str
    size: int
    etag: str
    at: float
    xet: bool = False  # the location is the Xet bridge (Hub repos stored with Xet), not the LFS CDN


# ---- trust policy around the library's HTTP client --------------------------------------------------
def origin_of(url: str) -> tuple[str, str, int]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme, 0)


def check_scheme(url: str, what: str) -> str:
    """http/https only; anything else (file://, dict://, ftp://, gopher://...) is refused before a request."""
    scheme = urlsplit(url).scheme.lower()
    if scheme not in ALLOWED_SCHEMES:
        raise UnsafeUrlError(f"refused {what} to {scheme or 'a scheme-less'} URL {url[:120]!r}: only http and "
                             "https are allowed; the endpoint (or something between) is not a Hub — check --endpoint")
    return url


@dataclass(frozen=True)
class _Policy:
    origin: tuple[str, str, int]
    max_body: int | None = None


_POLICY: ContextVar[_Policy | None] = ContextVar("moet_hub_policy", default=None)


class ListingTooLargeError(DownloadError):
    """The listing (or the file count) is past the cap: refused before it is held in memory."""


class _CappedStream(httpx2.SyncByteStream):
    """Counts body bytes as they arrive and stops past the cap (no 700 MB JSON held in memory)."""

    def __init__(self, inner: Any, cap: int, url: str) -> None:  # httpx2 types it sync-or-async; a sync client's
        self.inner, self.cap, self.url = inner, cap, url

    def __iter__(self) -> Iterator[bytes]:
        n = 0
        for chunk in self.inner:
            n += len(chunk)
            if n > self.cap:
                raise ListingTooLargeError(_too_large(self.url, n))
            yield chunk

    def close(self) -> None:
        self.inner.close()


def _too_large(url: str, n: int) -> str:
    return (f"the file listing from {urlsplit(url).netloc} is larger than {MAX_LISTING_BYTES // MiB} MiB "
            f"({n} bytes and counting): refused; this is not the chunked cache repo, or the endpoint is not a Hub")


def _guard_request(request: httpx2.Request) -> None:
    policy = _POLICY.get()
    if policy is None:
        return
    check_scheme(str(request.url), "a request")
    if origin_of(str(request.url)) != policy.origin:
        request.headers.pop("Authorization", None)  # the token stays with the configured endpoint


def _guard_response(response: httpx2.Response) -> None:
    policy = _POLICY.get()
    if policy is None:
        return
    location = response.headers.get("Location")
    if location and response.is_redirect:
        check_scheme(urljoin(str(response.request.url), location), "a redirect")
    if policy.max_body is not None and 200 <= response.status_code < 300:
        length = response.headers.get("Content-Length", "")
        if length.isdigit() and int(length) > policy.max_body:
            raise ListingTooLargeError(_too_large(str(response.request.url), int(length)))
        response.stream = _CappedStream(response.stream, policy.max_body, str(response.request.url))


def _panel_client() -> httpx2.Client:
    """huggingface_hub's default client plus the panel's guards (hf's own request hook stays first)."""
    # The library's own default hook (offline check, request id), kept first; not re-exported, so taken
    # from its module: the pinned range (pyproject, <3) is what tests/download/test_hub_*.py ran against.
    from huggingface_hub.utils._http import hf_request_event_hook

    return httpx2.Client(event_hooks={"request": [hf_request_event_hook, _guard_request],
                                      "response": [_guard_response]},
                         follow_redirects=True, timeout=None)


def install_guards() -> None:
    """huggingface_hub's public hook for a custom client (its docs: proxies, certificates).

    Installed when the library's shared client lacks the guards (first HubClient, or someone replaced the
    factory since), so a later `set_client_factory` elsewhere cannot silently switch them off.
    Before the library has built its client, the factory it will use is what counts: asking for the
    session to look at its hooks built a default client (a certificate load, 30-50 ms) only for
    `set_client_factory` to close it, on the path to every download's first request, in the CLI and
    in each artifact process (docs/downloads.md, "The artifact processes start light and early").
    """
    from huggingface_hub.utils import _http  # the shared client and its factory: not re-exported

    with _INSTALL_LOCK:
        live = _http._GLOBAL_CLIENT
        guarded = (_guard_request in live.event_hooks["request"] if live is not None
                   else _http._GLOBAL_CLIENT_FACTORY is _panel_client)
        if not guarded:
            huggingface_hub.set_client_factory(_panel_client)


_INSTALL_LOCK = threading.Lock()


# ---- errors -----------------------------------------------------------------------------------------
def offline() -> bool:
    """HF_HUB_OFFLINE as the library reads it at import, or set since (the panel may start first)."""
    return constants.is_offline_mode() or env.hf_offline()


def refuse_offline(cfg: DownloadConfig) -> None:
    if offline():
        raise OfflineError(f"HF_HUB_OFFLINE is set, so the panel will not contact {cfg.endpoint}; unset "
                           "HF_HUB_OFFLINE (and TRANSFORMERS_OFFLINE) to download, or copy the artifacts in by hand")


def retry_after_of(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `RateLimit: "...";r=0;t=12` (preferred) or `Retry-After: 12`."""
    rl = headers.get("RateLimit", "") or ""
    m = re.search(r"(?:^|;)\s*t=(\d+)", rl)
    if m:
        return float(m.group(1)) + (1.0 if re.search(r"r=0\b", rl) else 0.0)
    ra = (headers.get("Retry-After", "") or "").strip()
    return float(ra) if ra.isdigit() else None


def access_page(cfg: DownloadConfig) -> str:
    return f"{cfg.endpoint}/{cfg.repo}"


def explain(exc: BaseException, cfg: DownloadConfig, what: str) -> BaseException:
    """A huggingface_hub / transport exception -> the panel's error with its fix (README "Hub errors")."""
    if isinstance(exc, (DownloadError, TransientError)):
        return exc
    where = f"{cfg.repo} at {cfg.endpoint}"
    if isinstance(exc, OfflineModeIsEnabled):
        return OfflineError(f"HF_HUB_OFFLINE is set, so {what} was not fetched from {cfg.endpoint}; unset "
                            "HF_HUB_OFFLINE to download")
    if isinstance(exc, HfHubHTTPError):
        resp = exc.response
        status = resp.status_code if resp is not None else 0
        headers = resp.headers if resp is not None else {}
        if isinstance(exc, GatedRepoError):
            if status == 401 or not cfg.token:
                return AuthError(f"{cfg.repo} is gated and needs a token (HTTP {status} for {what}): create one at "
                                 "huggingface.co/settings/tokens, then set HF_TOKEN, use --token-file, or paste it "
                                 f"in the Downloads tab; accept the terms at {access_page(cfg)} with the same account")
            return AuthError(f"{cfg.repo} is gated and this token's account has not been granted access (HTTP 403 for "
                             f"{what}): open {access_page(cfg)}, accept the terms / request access with the account "
                             "that owns the token, wait for approval, then Resume")
        if isinstance(exc, RevisionNotFoundError):
            return NotFoundError(f"revision {cfg.revision!r} not found in {where}: check --revision "
                                 "(a branch, tag or full commit hash of that repo)")
        if isinstance(exc, EntryNotFoundError):
            return NotFoundError(f"{what} does not exist in {where} at that commit (HTTP {status}): the listing "
                                 "and the repo disagree; retry, and if it persists pin --revision to a commit")
        if isinstance(exc, DisabledRepoError):
            return NotFoundError(f"{where} has been disabled on the Hub: use another --repo")
        if isinstance(exc, RepositoryNotFoundError):
            if status == 401 and not cfg.token:
                return AuthError(f"401 for {what}: {where} needs a token (it is private or gated, or it does not "
                                 "exist): set HF_TOKEN, use --token-file, or paste it in the Downloads tab; "
                                 "check --repo too")
            return NotFoundError(f"repository {cfg.repo!r} not found at {cfg.endpoint} (HTTP {status}): check "
                                 "--repo/--endpoint (a private repo the token cannot read also answers 'not found')")
        if status == 401:
            if cfg.token:
                return AuthError(f"401 Unauthorized for {what} in {where}: the token was rejected; check it at "
                                 "huggingface.co/settings/tokens (expired, revoked or mistyped) and save it again")
            return AuthError(f"401 Unauthorized for {what} in {where}: this repo needs a token: set HF_TOKEN, "
                             "use --token-file, or paste it in the Downloads tab")
        if status == 403:
            return AuthError(f"403 Forbidden for {what} in {where}: the token lacks read access to this repo "
                             "(a fine-grained token needs 'read' on it); use a token with read access")
        if status in RETRY_STATUSES:
            return TransientError(f"HTTP {status} for {what}", retry_after_of(headers))
        return DownloadError(f"HTTP {status} for {what} from {cfg.endpoint}")
    if isinstance(exc, httpx2.UnsupportedProtocol):
        return UnsafeUrlError(f"refused a request for {what}: only http and https are allowed ({exc})")
    if isinstance(exc, httpx2.TooManyRedirects):
        return DownloadError(f"too many redirects for {what} from {cfg.endpoint}: the endpoint redirects in a "
                             "loop; check --endpoint")
    if isinstance(exc, httpx2.TransportError):
        return TransientError(f"{type(exc).__name__} for {what}: {exc}")
    return exc


class HttpAnswer(Protocol):
    """An HTTP answer's status and headers (httpx's, or libcurl's as download/fetch.py hands them in)."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...


def raise_for_hub_status(resp: HttpAnswer, cfg: DownloadConfig, what: str, url: str = "") -> None:
    """An HTTP answer (status_code + headers; e.g. libcurl's) classified by hf_raise_for_status, then explained."""
    if resp.status_code < 400:
        return
    request = httpx2.Request("GET", url or f"{cfg.endpoint}/{cfg.repo}/resolve/{cfg.revision}/{what}")
    response = httpx2.Response(resp.status_code, headers=dict(resp.headers), request=request)
    try:
        hf_raise_for_status(response)
    except HfHubHTTPError as exc:
        raise explain(exc, cfg, what) from None
    raise DownloadError(f"HTTP {resp.status_code} for {what} from {cfg.endpoint}")


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, (TransientError, httpx2.TransportError)) and not isinstance(exc, httpx2.UnsupportedProtocol)


def make_wait(cfg: DownloadConfig) -> Callable[[RetryCallState], float]:
    """Exponential backoff (base·2^n, capped), or exactly what the server asked for."""

    def wait(retry_state: RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(exc, TransientError) and exc.retry_after is not None:
            return min(exc.retry_after, 300.0)
        attempt = retry_state.attempt_number
        return min(cfg.backoff_max_s, cfg.backoff_base_s * 2.0 ** (attempt - 1))

    return wait


# ---- listing ----------------------------------------------------------------------------------------
def _malformed(cfg: DownloadConfig, why: str) -> DownloadError:
    return DownloadError(f"the Hub's file listing for {cfg.repo} at {cfg.endpoint} is malformed ({why}); "
                         "check --endpoint points at a Hugging Face Hub or mirror")


def plain_name(name: str) -> bool:
    """A repo path the panel may turn into a staging file: no directory part, no '..', no control characters."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name \
        and not any(ord(c) < 32 or ord(c) == 127 for c in name)


def parse_listing(info: object, cfg: DownloadConfig) -> tuple[str, str, list[TreeEntry]]:
    """The model-info JSON -> (commit, repo id, entries), every field type-checked before use.

    The JSON's values come as the server wrote them (a size may be a string, a name a number), so
    nothing from it reaches a path or an arithmetic before this check.
    """
    if not isinstance(info, dict):
        raise _malformed(cfg, f"the answer is {type(info).__name__}, not an object")
    commit, repo_id, siblings = info.get("sha"), info.get("id"), info.get("siblings")
    if not isinstance(commit, str) or not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise DownloadError(f"the Hub did not say which commit {cfg.revision!r} of {cfg.repo} is (no valid 'sha' in "
                            f"its answer, got {str(commit)[:60]!r}); the panel pins every download to a commit, so it "
                            "stops here: check --endpoint is a Hub or mirror that reports commits")
    if not isinstance(repo_id, str) or not repo_id:
        raise _malformed(cfg, "'id' is not a string")
    if not isinstance(siblings, list):
        raise _malformed(cfg, f"'siblings' is {type(siblings).__name__}, not a list")
    if len(siblings) > MAX_FILES:
        raise ListingTooLargeError(f"{cfg.repo} lists {len(siblings)} files (the panel accepts up to {MAX_FILES}): "
                                   "this is not the chunked cache repo; check --repo")
    out = []
    for i, s in enumerate(siblings):
        name = s.get("rfilename") if isinstance(s, dict) else None
        if not isinstance(name, str) or not name:
            raise _malformed(cfg, f"entry {i} has no file name")
        size = s["size"] if s.get("size") is not None else 0
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise _malformed(cfg, f"{name[:80]!r} has size {size!r}")
        sha, lfs = None, s.get("lfs")
        if lfs:  # as the library reads it: an empty or missing "lfs" is a plain git file
            sha = lfs.get("sha256") if isinstance(lfs, dict) else None
            if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
                raise _malformed(cfg, f"{name[:80]!r} has no valid LFS sha256")
        out.append(TreeEntry(name, size, sha))
    return commit, repo_id, out


T = TypeVar("T")


class _Call(Protocol):
    """Run fn(*args) with the Hub's retry policy and error explanations (HubClient._retrying)."""

    def __call__(self, fn: Callable[..., T], *args: object) -> T: ...


class HubClient:
    """One download's view of the Hub. Interface used by plan.py, fetch.py, job.py (kept stable)."""

    def __init__(self, cfg: DownloadConfig, sleep: Callable[[float], None] = time.sleep) -> None:
        check_scheme(cfg.endpoint, "the endpoint")
        install_guards()
        self.cfg = cfg
        self._sleep = sleep
        self._origin = origin_of(cfg.endpoint)
        self._locations: dict[str, Resolved] = {}
        self._lock = threading.Lock()
        self._resolve_lock = threading.Lock()  # one HEAD per part even when workers race for it
        self.commit: str | None = None
        self.repo = cfg.repo  # the repo's current name: a renamed repo is followed (renamed_from says so)
        self.renamed_from: str | None = None

    @contextmanager
    def _guarded(self, max_body: int | None = None) -> Iterator[None]:
        reset = _POLICY.set(_Policy(self._origin, max_body))
        try:
            yield
        finally:
            _POLICY.reset(reset)

    def _retrying(self, what: str) -> _Call:
        retrying = Retrying(stop=stop_after_attempt(self.cfg.api_attempts), wait=make_wait(self.cfg),
                            retry=retry_if_exception(is_transient), reraise=True, sleep=self._sleep)

        def call(fn: Callable[..., T], *args: object) -> T:
            def once() -> T:
                refuse_offline(self.cfg)
                try:
                    return fn(*args)
                except Exception as exc:  # classified by explain(), or passed on unchanged
                    mapped = explain(exc, self.cfg, what)
                    if mapped is exc:
                        raise
                    raise mapped from None

            try:
                return retrying(once)
            except TransientError as exc:
                wait = f"; the Hub asked to wait {exc.retry_after:g} s" if exc.retry_after else ""
                limited = "rate limited by the Hub (429)" if "429" in str(exc) else f"cannot reach the Hub ({exc})"
                raise DownloadError(f"{limited} at {self.cfg.endpoint} for {what} after {self.cfg.api_attempts} "
                                    f"attempts{wait}; check --endpoint and the network, wait, then Resume") from None

        return call

    # ---- listing + commit -------------------------------------------------------------------------
    def list_files(self, revision: str | None = None) -> list[TreeEntry]:
        """Every file at `revision` with its size and LFS sha256; pins `self.commit` to the answer's commit."""
        rev = revision or self.cfg.revision
        listing: tuple[str, str, list[TreeEntry]] = self._retrying("the file listing")(self._info, rev)
        commit, repo_id, entries = listing
        if repo_id != self.cfg.repo and self.renamed_from is None:
            log.warning("the Hub redirected %s to %s (renamed repo); following", self.cfg.repo, repo_id)
            self.renamed_from, self.repo = self.cfg.repo, repo_id
        self.commit = commit
        return entries

    def _info(self, rev: str) -> tuple[str, str, list[TreeEntry]]:
        """GET /api/models/{repo}/revision/{rev}?blobs=true, as HfApi.model_info(files_metadata=True) sends it."""
        try:
            validate_repo_id(self.cfg.repo)
        except HFValidationError as exc:  # its advice about `repo_type` is for the library's callers, not ours
            why = str(exc).replace(" Use `repo_type` argument if needed.", "").rstrip(".")
            raise DownloadError(f"--repo {self.cfg.repo[:120]!r} is not a Hub repo id ({why}); "
                                "use owner/name as on the repo's page") from None
        url = f"{self.cfg.endpoint}/api/models/{self.cfg.repo}/revision/{quote(rev, safe='')}"
        headers = build_hf_headers(token=self.cfg.token or False, library_name="moet-panel", library_version="0.1")
        with self._guarded(MAX_LISTING_BYTES):
            r = get_session().get(url, headers=headers, params={"blobs": True}, timeout=self.cfg.stall_s)
            hf_raise_for_status(r)
            try:
                info = r.json()
            except ValueError as exc:  # not JSON (a captive portal, a wrong --endpoint)
                raise _malformed(self.cfg, f"{type(exc).__name__}: {str(exc)[:80]}") from None
        return parse_listing(info, self.cfg)

    # ---- resolve ----------------------------------------------------------------------------------
    def resolve(self, path: str, revision: str | None = None, fresh: bool = False) -> Resolved:
        """HEAD /resolve/ via get_hf_file_metadata, cached for LOCATION_TTL_S."""
        rev = revision or self.commit or self.cfg.revision
        with self._resolve_lock:
            hit = self._cached(path)
            if hit and not fresh:
                return hit
            resolved: Resolved = self._retrying(path)(self._head, path, rev)
            with self._lock:
                self._locations[path] = resolved
            return resolved

    def _cached(self, path: str) -> Resolved | None:
        """The resolution of `path` while it is younger than LOCATION_TTL_S."""
        with self._lock:
            hit = self._locations.get(path)
        return hit if hit and time.monotonic() - hit.at < LOCATION_TTL_S else None

    def forget(self, path: str) -> None:
        with self._lock:
            self._locations.pop(path, None)

    def known(self, paths: list[str]) -> dict[str, Resolved]:
        """What is resolved already of `paths`: handed to an artifact's process (procs.py)."""
        with self._lock:
            return {p: self._locations[p] for p in paths if p in self._locations}

    def remember(self, known: Mapping[str, Resolved]) -> None:
        """Resolutions made by another process (time.monotonic is the machine's clock, so their age holds)."""
        with self._lock:
            self._locations.update(known)

    def _head(self, path: str, rev: str) -> Resolved:
        url = hf_hub_url(self.repo, path, revision=rev, endpoint=self.cfg.endpoint)
        with self._guarded():
            meta = get_hf_file_metadata(url, token=self.cfg.token or False, timeout=self.cfg.stall_s,
                                        library_name="moet-panel", library_version="0.1", endpoint=self.cfg.endpoint)
        if not meta.commit_hash:
            raise DownloadError(f"the Hub answered {path} without X-Repo-Commit, so the download cannot be pinned to "
                                f"a commit of {self.cfg.repo}: check --endpoint is a Hub or a mirror that forwards "
                                "X-Repo-Commit")
        if self.commit and meta.commit_hash != self.commit:
            raise DownloadError(f"{path} resolved at commit {meta.commit_hash[:12]}, not the pinned "
                                f"{self.commit[:12]}: the endpoint ignores the revision; check --endpoint")
        location = check_scheme(urljoin(url, meta.location), f"the download of {path}")
        return Resolved(commit=meta.commit_hash, location=location, size=meta.size or 0,
                        etag=(meta.etag or "").strip('"'), at=time.monotonic(), xet=meta.xet_file_data is not None)

    def headers_for(self, location: str) -> dict[str, str]:
        """Auth only for the configured endpoint's own origin; never for a CDN / Xet bridge / other host."""
        if self.cfg.token and origin_of(location) == self._origin:
            return {"Authorization": f"Bearer {self.cfg.token}"}
        return {}

    def where(self, res: Resolved) -> str:
        """Who serves a download URL, for messages (the Xet bridge answers for Xet-stored repos)."""
        host = urlsplit(res.location).netloc
        return f"the Xet bridge ({host})" if res.xet or "xethub" in host else f"the download host ({host})"
