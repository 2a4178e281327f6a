"""The one client of the engine's HTTP API (docs/engine.md, "Engine client"): `/health`, `/v1/models`,
`/metrics`, `/tokenize` over one kept-alive httpx client per base URL, and `/v1/chat/completions` streamed
through the openai SDK (its SSE parsing and errors) — the one SDK wrapper, used by the chat, the self-test
and the A/B run. Also the one address rule (recipe/endpoint.py): an engine on a unix socket (`unix:/…/engine.sock`,
issue 40) is reached through an httpx transport bound to that socket, the SDK's too; a wildcard listen host is
reached on loopback.

Not here: the gateway's proxy (`gateway/proxy.py`) keeps its own async client (it copies a client's stream
through, it does not read the engine), and the generation canary (`engine/supervision/canary.py`) opens a connection per
canary so that closing it aborts the canary in vLLM.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import httpx

from app.backend.contracts import JsonObject
from app.backend.engine.errlog import ENGINE_ERRORS
# the address rule lives in recipe/endpoint.py; re-exported here for the engine's clients
from app.backend.recipe.endpoint import LOOPBACK as LOOPBACK
from app.backend.recipe.endpoint import UDS_SCHEME, engine_endpoint
from app.backend.recipe.endpoint import WILDCARD_HOSTS as WILDCARD_HOSTS
from app.backend.recipe.endpoint import EngineEndpoint as EngineEndpoint
from app.backend.recipe.endpoint import connect_host as connect_host
from app.backend.recipe.schema import Recipe

if TYPE_CHECKING:  # imported when first streamed: the hub, the controller and the CLI's reads never stream
    import httpx2
    import openai

API_KEY_NONE = "EMPTY"  # vLLM without --api-key accepts any key; the SDK insists on one
# The stream whose request this thread is sending: its connection's socket is caught as the connection opens, so
# `abort()` can wake a thread still waiting for the answer's headers (a chat waiting in the gateway's fair queue)
_OPENING = threading.local()
_CONNECTED = ("connection.connect_tcp.complete", "connection.connect_unix_socket.complete")
DEFAULT_TIMEOUT = httpx.Timeout(5.0, connect=1.0)
TOKENIZE_TIMEOUT = httpx.Timeout(900.0, connect=5.0)  # a 256K-token prompt takes a while to tokenize
CLIENTS_KEPT = 16  # base URLs with a kept-alive client (tests start many simulated engines in one process)

Timeout = httpx.Timeout | float


# -- the address rule ------------------------------------------------------------------------------------------
def is_uds(url: str) -> bool:
    """True for an engine address on a unix socket (`unix:/…/engine.sock`)."""
    return url.strip().startswith(UDS_SCHEME)


def is_loopback(url: str) -> bool:
    return is_uds(url) or httpx.URL(url).host in (LOOPBACK, "localhost", "::1")


def base_url(recipe: Recipe, data_dir: str | Path, gpu: int | None = None) -> str:
    """The address of the engine the panel runs for this recipe on this data dir: `unix:/…/engine.sock`, or
    http://127.0.0.1:8000 for a recipe with `listen = "tcp"` (no /v1)."""
    return engine_endpoint(recipe, data_dir, gpu).address


def api_base(url: str) -> str:
    """'http://h:8000', 'http://h:8000/', 'http://h:8000/v1' -> 'http://h:8000/v1' (a unix: address: its URL over
    the socket, 'http://engine/v1')."""
    if is_uds(url):
        return EngineEndpoint.parse(url).url + "/v1"
    root = url.strip().rstrip("/")
    return root.removesuffix("/v1") + "/v1"


def server_root(url: str) -> str:
    """'http://h:8000/v1/' -> 'http://h:8000'; 'unix:/p/engine.sock' stays as it is (its text form)."""
    if is_uds(url):
        return EngineEndpoint.parse(url).address
    return api_base(url)[: -len("/v1")]


def own_http(url: str, timeout: httpx.Timeout) -> tuple[httpx.Client, str]:
    """A new httpx client of its own for the engine at `url` (over its socket for a unix: address) and the root
    to address requests to: for a caller that must close its connection to abort (the canary)."""
    uds = EngineEndpoint.parse(url).uds if is_uds(url) else None
    client = httpx.Client(timeout=timeout, trust_env=not is_loopback(url),
                          transport=httpx.HTTPTransport(uds=uds) if uds else None)
    return client, api_base(url)[: -len("/v1")]


# -- one /metrics read ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricsRead:
    """One `GET /metrics` (Prometheus text); parsed by its readers (telemetry/metrics.py, engine/supervision/stall.py)."""

    text: str
    ts: float  # wall time of the read
    monotonic: float  # the same moment on the monotonic clock

    def age_s(self) -> float:
        return time.monotonic() - self.monotonic


# -- the streamed chat completion -----------------------------------------------------------------------------
StreamFailureKind = Literal["http", "timeout", "connect", "broken"]


class StreamFailure(Exception):
    """A chat stream that could not open or broke mid-answer, with a sentence a person can act on."""

    def __init__(self, kind: StreamFailureKind, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.kind: StreamFailureKind = kind
        self.message = message
        self.status_code = status_code


class CompletionStream:
    """Iterate for the raw chunk dicts of one streamed `/v1/chat/completions`; raises StreamFailure. Opens on
    the first iteration. `abort()` may be called from any thread: it unblocks a pending read and closes the
    connection, which makes vLLM abort the request (docs/chat.md); iteration then just ends."""

    def __init__(self, sdk: openai.OpenAI, body: Mapping[str, object], where: str = "") -> None:
        self._sdk = sdk
        self._where = where or str(sdk.base_url).rstrip("/").removesuffix("/v1")  # the address, for messages
        self._body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        self._stream: openai.Stream[object] | None = None
        self._aborted = threading.Event()
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None  # its connection's, from the moment it opened (_trace)

    @property
    def aborted(self) -> bool:
        return self._aborted.is_set()

    def __enter__(self) -> CompletionStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[JsonObject]:
        import httpx2  # the HTTP client the openai SDK is built on (its errors and responses)
        import openai

        stream = self._open()
        if stream is None:
            return
        try:
            for chunk in stream:
                if isinstance(chunk, dict):
                    yield chunk
                if self._aborted.is_set():
                    return
        except (openai.APIConnectionError, openai.APITimeoutError, openai.APIError, httpx2.HTTPError) as exc:
            if self._aborted.is_set():
                return
            kind: StreamFailureKind = "timeout" if isinstance(exc, openai.APITimeoutError) else "broken"
            cause = exc.__cause__ or exc
            raise StreamFailure(kind, f"the connection to the engine broke mid-answer "
                                      f"({type(cause).__name__}: {cause})") from exc

    def abort(self) -> None:
        self._aborted.set()
        with self._lock:
            stream, sock = self._stream, self._sock
        if stream is not None:
            _shutdown_socket(stream.response)
        elif sock is not None:  # still waiting for the headers (queued at the gateway, say): leave now
            _shutdown(sock)

    def trace(self, event: str, info: object) -> None:
        """httpcore's trace of this stream's request: its connection's socket, as it opens."""
        if event in _CONNECTED and isinstance(info, dict):
            net = info.get("return_value")
            sock = net.get_extra_info("socket") if net is not None else None
            if isinstance(sock, socket.socket):
                with self._lock:
                    self._sock = sock
                if self._aborted.is_set():
                    _shutdown(sock)

    def close(self) -> None:
        with self._lock:
            stream = self._stream
        if stream is not None:
            try:
                stream.close()
            except Exception as exc:  # closing a broken connection may raise; nothing left to do
                ENGINE_ERRORS.caught("closing an engine stream", exc, level=logging.DEBUG)

    def _open(self) -> openai.Stream[object] | None:
        """The stream, once its answer's headers came; None when aborted before them."""
        import openai

        _OPENING.stream = self  # its connection's socket is caught as it opens (_with_trace, trace)
        try:
            # The SDK's generic post with cast_to=object: its HTTP, SSE parsing and errors, but chunks come back
            # as plain dicts. Building typed chunk models cost 3x the CPU (measured: 0.24 vs 0.08 ms per token),
            # a real share of a core at 200 tok/s.
            stream: openai.Stream[object] = self._sdk.post("/chat/completions", body=self._body, cast_to=object, stream=True,
                                    stream_cls=openai.Stream[object])
        except openai.APIStatusError as exc:
            raise StreamFailure("http", _status_message(exc), exc.status_code) from exc
        except (openai.APIConnectionError, openai.APITimeoutError) as exc:
            if self._aborted.is_set():
                return None  # stopped while it waited for the answer's headers (abort shut its connection)
            if isinstance(exc, openai.APITimeoutError):
                raise StreamFailure("timeout", "the engine did not answer in time") from exc
            cause = exc.__cause__ or exc
            root = self._where
            raise StreamFailure("connect", f"nothing is answering at {root} ({type(cause).__name__}: {cause})"
                                .replace(": )", ")")) from exc
        finally:
            _OPENING.stream = None
        with self._lock:
            self._stream = stream
        if self._aborted.is_set():
            _shutdown_socket(stream.response)
        return stream


def _shutdown_socket(response: httpx2.Response) -> None:
    """Wake a thread blocked reading this response: shutdown() interrupts recv(), close() does not."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


def _with_trace(request: httpx2.Request) -> None:
    """The SDK's request hook: a stream being opened on this thread follows its connection (CompletionStream.trace)."""
    opening = getattr(_OPENING, "stream", None)
    if opening is not None:
        request.extensions["trace"] = opening.trace


def _status_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    detail = str(body.get("message") or body.get("error") or "") if isinstance(body, dict) else ""
    return f"the engine refused the request (HTTP {exc.status_code}): {detail or exc.message}"


# -- the client -----------------------------------------------------------------------------------------------
class EngineClient:
    """One engine (or any OpenAI-compatible server) at `url`; thread-safe. Plain reads raise httpx.HTTPError
    (httpx.HTTPStatusError for an answer other than 200 where a body is needed) or ValueError (bad JSON).
    Use `engine_client(url)` for the shared, kept-alive one; build one directly only for an API key."""

    def __init__(self, url: str, api_key: str | None = None, verify: bool = True) -> None:
        """`verify` False: TLS without checking the certificate (only the panel's own gateway on this box's own
        address: docs/chat.md "Taking turns")."""
        self.base_url = server_root(url)
        self._verify = verify  # the address as given: 'http://h:8000' or 'unix:/p/engine.sock'
        # an engine on a unix socket: requests go to http://engine through a transport bound to the socket
        self._uds = EngineEndpoint.parse(url).uds if is_uds(url) else None
        self._root = api_base(url)[: -len("/v1")]  # where requests are addressed
        self._api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        # An engine on loopback is never reached through a proxy from the environment (HTTPS_PROXY for downloads).
        self._http = httpx.Client(timeout=DEFAULT_TIMEOUT, headers=headers, trust_env=not is_loopback(self.base_url),
                                  verify=verify, transport=httpx.HTTPTransport(uds=self._uds) if self._uds else None)
        self._sdk: openai.OpenAI | None = None
        self._last_metrics: MetricsRead | None = None
        self._lock = threading.Lock()

    def health(self, timeout: Timeout = DEFAULT_TIMEOUT) -> int:
        """`GET /health`: its HTTP status (vLLM answers 200 once loaded)."""
        return self._http.get(self._root + "/health", timeout=timeout).status_code

    def models(self, timeout: Timeout = DEFAULT_TIMEOUT) -> tuple[str, ...]:
        """`GET /v1/models`: the served model names."""
        r = self._http.get(self._root + "/v1/models", timeout=timeout)
        r.raise_for_status()
        data = r.json().get("data") or []
        return tuple(str(m.get("id", "")) for m in data if isinstance(m, dict))

    def metrics(self, max_age_s: float = 0.0, timeout: Timeout = DEFAULT_TIMEOUT) -> MetricsRead:
        """`GET /metrics`, or the last read when it is at most `max_age_s` old: the telemetry's 1 s scrape and the
        liveness check share one read a second (docs/engine.md, "Engine client")."""
        with self._lock:
            last = self._last_metrics
        if last is not None and max_age_s > 0 and last.age_s() <= max_age_s:
            return last
        r = self._http.get(self._root + "/metrics", timeout=timeout)
        r.raise_for_status()
        read = MetricsRead(r.text, time.time(), time.monotonic())
        with self._lock:
            if self._last_metrics is None or self._last_metrics.monotonic < read.monotonic:
                self._last_metrics = read
        return read

    def tokenize(self, model: str, messages: list[dict[str, str]], timeout: Timeout = TOKENIZE_TIMEOUT) -> int:
        """Prompt tokens of chat messages, counted by the engine itself (vLLM's `POST /tokenize`)."""
        r = self._http.post(self._root + "/tokenize", json={"model": model, "messages": messages}, timeout=timeout)
        if r.status_code == 404:
            raise RuntimeError("the engine has no /tokenize route (vLLM serves it by default; is this vLLM?)")
        r.raise_for_status()
        return int(r.json()["count"])

    def stream_chat(self, body: Mapping[str, object]) -> CompletionStream:
        """A streamed `POST /v1/chat/completions` of `body` (model, messages, sampling...; `stream` and
        `stream_options.include_usage` are set here). Opens when iterated."""
        return CompletionStream(self._openai(), body, self.base_url)

    def close(self) -> None:
        self._http.close()
        with self._lock:
            sdk, self._sdk = self._sdk, None
        if sdk is not None:
            sdk.close()

    def _openai(self) -> openai.OpenAI:
        with self._lock:
            if self._sdk is None:
                import httpx2
                import openai

                # over a unix socket: the SDK's own HTTP client, bound to the socket (its base URL http://engine/v1).
                # A connection per stream (none kept alive), each followed from its opening, so a Stop can end one
                # still waiting for its answer's headers (CompletionStream.abort); on this box that costs ~0.1 ms
                hooks, limits = {"request": [_with_trace]}, httpx2.Limits(max_keepalive_connections=0)
                http_client = (httpx2.Client(transport=httpx2.HTTPTransport(uds=self._uds), trust_env=False,
                                             event_hooks=hooks, limits=limits) if self._uds else
                               openai.DefaultHttpxClient(verify=self._verify, trust_env=self._verify, event_hooks=hooks,
                                                         limits=limits))  # unverified: this box's own gateway only
                self._sdk = openai.OpenAI(
                    base_url=self._root + "/v1", api_key=self._api_key or API_KEY_NONE,
                    max_retries=0,  # a retried stream would duplicate tokens; failures are shown instead
                    # read: prefill of a 256K-token prompt can take minutes before the first chunk
                    timeout=httpx2.Timeout(900.0, connect=5.0, write=30.0, pool=5.0), http_client=http_client)
            return self._sdk


_clients: OrderedDict[str, EngineClient] = OrderedDict()
_clients_lock = threading.Lock()


def engine_client(url: str) -> EngineClient:
    """The shared, kept-alive client for this base URL (with or without /v1). The least recently used beyond
    CLIENTS_KEPT is dropped, not closed: a caller may still hold it, and its pool closes when it is collected."""
    root = server_root(url)
    with _clients_lock:
        client = _clients.get(root)
        if client is None:
            client = _clients[root] = EngineClient(root)
            while len(_clients) > CLIENTS_KEPT:
                _clients.popitem(last=False)
        else:
            _clients.move_to_end(root)
        return client
