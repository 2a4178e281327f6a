"""Downloader trust boundaries (issue 13 item 3) against a hostile local Hub: http/https only for every
request and redirect, the token to the configured endpoint's origin only (a listener on another port
records every Authorization header), and a listing that is type-checked, bounded and never paged."""

from __future__ import annotations

import json
import os
import socket
import threading
import tracemalloc
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pycurl
import pytest

from app.backend.download.hub import ListingTooLargeError
from app.backend.download.ranged import UnsafeUrlError
from app.backend.download.ranged import RangeGetter, restrict_protocols
from app.backend.download.types import DownloadError
from app.backend.simhub.artifacts import file_digest_tree
from app.backend.simhub.faults import Fault

from .conftest import KNOWN_TOKEN, PREFIX, run

REPO = "moet-panel/simulated-cache"
PART1 = PREFIX + "001"
pytestmark = pytest.mark.timeout(60)  # "fails fast": a spin on file:///dev/zero or a paging loop ends here



@dataclass
class Listener:
    """Another origin (another port of 127.0.0.1): records each request's path and Authorization."""

    seen: list[tuple[str, str]] = field(default_factory=list)
    raw_connections: int = 0

    @property
    def tokens(self) -> list[str]:
        return [auth for _, auth in self.seen if auth]


@pytest.fixture
def listener() -> Iterator[tuple[Listener, str]]:
    rec = Listener()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def _any(self) -> None:
            rec.seen.append((self.path, self.headers.get("Authorization", "")))
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = _any

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        yield rec, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture
def tcp() -> Iterator[tuple[Listener, int]]:
    """A raw TCP port (a stand-in for a local service dict:// or ftp:// could talk to): counts connections."""
    rec = Listener()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            rec.raw_connections += 1
            conn.close()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield rec, sock.getsockname()[1]
    finally:
        stop.set()
        t.join(5)
        sock.close()


def hostile_targets(port: int) -> list[str]:
    return [f"dict://127.0.0.1:{port}/d:INJECTED", "file:///dev/zero", "file:///etc/passwd",
            f"ftp://127.0.0.1:{port}/x", f"gopher://127.0.0.1:{port}/_x"]


# ---- schemes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["resolve", "info"])
@pytest.mark.parametrize("i", range(5), ids=["dict", "file-zero", "file-passwd", "ftp", "gopher"])
def test_redirect_to_another_scheme_fails_fast(settings, hub, tcp, tmp_path, where, i):
    rec, port = tcp
    target = hostile_targets(port)[i]
    key = "__info__" if where == "info" else "*"
    hub.add_fault(key, Fault("redirect", where=where, target=target, times=-1))
    with pytest.raises(UnsafeUrlError) as err:
        run(settings, hub.endpoint, tmp_path / "d")
    assert "only http and https" in str(err.value) and target.split(":")[0] in str(err.value)
    assert rec.raw_connections == 0, "something connected to the local service"
    assert not (tmp_path / "d" / "planescache").exists()


def test_libcurl_itself_refuses_other_protocols():
    c = pycurl.Curl()
    restrict_protocols(c)
    c.setopt(pycurl.URL, "file:///etc/passwd")
    c.setopt(pycurl.WRITEFUNCTION, lambda b: None)
    with pytest.raises(pycurl.error) as err:
        c.perform()
    c.close()
    assert err.value.args[0] == pycurl.E_UNSUPPORTED_PROTOCOL


def test_range_getter_refuses_before_libcurl():
    g = RangeGetter(1.0, 1.0)
    try:
        reply = g.get("file:///etc/passwd", {}, lambda r, b: None, lambda: False)
    finally:
        g.close()
    assert isinstance(reply.aborted, UnsafeUrlError) and reply.status == 0


# ---- the token stays with the endpoint's origin -------------------------------------------------------
def test_token_not_sent_to_a_cdn_on_another_origin(settings, private_hub, listener, tmp_path):
    rec, other = listener
    private_hub.add_fault("*", Fault("redirect", where="resolve", target=f"{other}/cdn/x", times=-1))
    with pytest.raises(DownloadError):
        run(settings, private_hub.endpoint, tmp_path / "d", token=KNOWN_TOKEN, attempts_without_progress=2)
    assert rec.seen, "the redirect target was fetched: the test proves something"
    assert rec.tokens == [], f"token leaked to another origin: {rec.tokens}"


def test_token_not_forwarded_on_a_listing_redirect(settings, private_hub, listener, tmp_path):
    rec, other = listener
    private_hub.add_fault("__info__", Fault("redirect", where="info", target=f"{other}/api/x", times=-1))
    with pytest.raises(DownloadError):
        run(settings, private_hub.endpoint, tmp_path / "d", token=KNOWN_TOKEN)
    assert rec.seen and rec.tokens == []


def _info_body(hub) -> dict:
    with urllib.request.urlopen(f"{hub.endpoint}/api/models/{REPO}/revision/main?blobs=true") as r:
        return json.load(r)


def test_link_next_to_another_host_or_to_itself_is_never_followed(settings, private_hub, listener, artifact,
                                                                  tmp_path):
    rec, other = listener
    private_hub.token = None  # to read the body for the fault, then on again
    body = json.dumps(_info_body(private_hub)).encode()
    private_hub.token = KNOWN_TOKEN
    private_hub.stats.requests.clear()
    self_url = f"{private_hub.endpoint}/api/models/{REPO}/revision/main?blobs=true"
    link = f'<{other}/api/models/{REPO}/tree/main?cursor=2>; rel="next", <{self_url}>; rel="next"'
    private_hub.add_fault("__info__", Fault("body", where="info", body=body, headers={"Link": link}, times=-1))
    run(settings, private_hub.endpoint, tmp_path / "d", token=KNOWN_TOKEN)
    assert file_digest_tree(tmp_path / "d") == artifact.reference
    assert rec.seen == [], "a Link page was fetched"
    assert private_hub.stats.requests[("info", REPO)] == 1, "the listing is one answer, never paged"


# ---- the listing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [PREFIX + "/../../evil", PREFIX + "001/../../evil", PREFIX + "0\x01"])
def test_part_name_must_be_a_plain_file_name(settings, hub, tmp_path, monkeypatch, name):
    info = _info_body(hub)
    info["siblings"].append({"rfilename": name, "size": 10, "lfs": {"sha256": "a" * 64, "size": 10,
                                                                     "pointerSize": 134}})
    hub.add_fault("__info__", Fault("body", where="info", body=json.dumps(info).encode(), times=-1))
    opened: list[str] = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (opened.append(str(p)), real_open(p, *a, **k))[1])
    with pytest.raises(DownloadError) as err:
        run(settings, hub.endpoint, tmp_path / "d")
    assert "refused part name" in str(err.value)
    assert not [p for p in opened if "evil" in p or "\x01" in p], opened
    assert not (tmp_path / "evil").exists()


def test_oversized_listing_is_refused_fast_and_small(settings, hub, tmp_path):
    hub.add_fault("__info__", Fault("huge_listing", where="info", count=10**6, times=-1))
    tracemalloc.start()
    try:
        with pytest.raises(ListingTooLargeError) as err:
            run(settings, hub.endpoint, tmp_path / "d", api_attempts=1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "larger than 32 MiB" in str(err.value)
    assert peak < 200 << 20, f"{peak >> 20} MiB held for a refused listing"


def _commit(hub) -> str:
    return hub.repos[REPO].commit


@pytest.mark.parametrize("body", [
    b"not json at all",
    b"[]",
    b'"a string"',
    b'{"id": "x"}',
    b'{"sha": 5, "id": "x", "siblings": []}',
    b'{"sha": "COMMIT", "id": "x", "siblings": {"a": 1}}',
    b'{"sha": "COMMIT", "id": 7, "siblings": []}',
    b'{"sha": "COMMIT", "id": "x", "siblings": [5]}',
    b'{"sha": "COMMIT", "id": "x", "siblings": [{"rfilename": 5}]}',
    b'{"sha": "COMMIT", "id": "x", "siblings": [{"rfilename": "PART", "size": "12"}]}',
    b'{"sha": "COMMIT", "id": "x", "siblings": [{"rfilename": "PART", "size": -1}]}',
    b'{"sha": "COMMIT", "id": "x", "siblings": [{"rfilename": "PART", "size": 1, "lfs": {"size": 1}}]}',
    (b'{"sha": "COMMIT", "id": "x", "siblings": [{"rfilename": "PART", "size": 1, '
     b'"lfs": {"sha256": 12, "size": 1, "pointerSize": 1}}]}'),
    (b'{"sha": "COMMIT", "id": "x", "siblings": [{"rfilename": "PART", "size": 1, '
     b'"lfs": {"sha256": "../../x", "size": 1, "pointerSize": 1}}]}'),
], ids=lambda b: b[:40].decode(errors="replace"))
def test_wrong_json_types_give_a_clear_error(settings, hub, tmp_path, body):
    body = body.replace(b"COMMIT", _commit(hub).encode()).replace(b"PART", PART1.encode())
    hub.add_fault("__info__", Fault("body", where="info", body=body, times=-1))
    with pytest.raises(DownloadError) as err:
        run(settings, hub.endpoint, tmp_path / "d")
    msg = str(err.value)
    assert ("malformed" in msg or "which commit" in msg) and "internal error" not in msg, msg


def test_guards_come_back_after_another_client_factory(settings, private_hub, listener, tmp_path):
    import huggingface_hub
    from huggingface_hub.utils._http import default_client_factory

    huggingface_hub.set_client_factory(default_client_factory)  # e.g. another library in the process
    test_token_not_forwarded_on_a_listing_redirect(settings, private_hub, listener, tmp_path)
    from app.backend.download.hub import _guard_request

    assert _guard_request in huggingface_hub.get_session().event_hooks["request"]


def test_the_guards_cost_no_throwaway_client(settings, hub, tmp_path, monkeypatch):
    """A fresh process's first HubClient installs the guards without building the library's default
    client first (a certificate load that `set_client_factory` closed at once); its one client has them."""
    import huggingface_hub
    from huggingface_hub.utils import _http

    from app.backend.download import hub as hub_mod

    built: list[int] = []

    def counting_default() -> Any:
        built.append(1)
        return _http.default_client_factory()

    huggingface_hub.close_session()
    monkeypatch.setattr(_http, "_GLOBAL_CLIENT_FACTORY", counting_default)  # as a fresh process: no client yet
    hub_mod.install_guards()
    assert built == [], "the library's default client was built only to be closed"
    client = huggingface_hub.get_session()
    assert hub_mod._guard_request in client.event_hooks["request"]
    hub_mod.install_guards()  # installed already: the live client has the guards and stays
    assert huggingface_hub.get_session() is client
    run(settings, hub.endpoint, tmp_path / "d")  # and a download goes through the guarded client


@pytest.mark.parametrize("repo", ["a/../../api/whoami-v2", "owner/name/extra", "bad name/x"])
def test_a_repo_id_the_hub_would_refuse_is_refused_before_any_request(settings, hub, tmp_path, repo):
    """The library's own repo-id rule (validate_repo_id): a `..` never travels into the listing's URL path."""
    with pytest.raises(DownloadError) as err:
        run(settings, hub.endpoint, tmp_path / "d", repo=repo)
    assert "is not a Hub repo id" in str(err.value) and "owner/name" in str(err.value), err.value
    assert not any(hub.stats.requests.values()), hub.stats.requests  # nothing reached the hub
