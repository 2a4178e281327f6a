"""The gateway in front of the SIMULATED engine, driven by the real `openai` SDK (issue 31, docs/gateway.md)."""

from __future__ import annotations

import json
import socket
import stat
import threading
import time

import httpx
import openai
import pytest

from app.backend.gateway.keys import KeyStore, KeyStoreError
from app.backend.gateway.proxy import Limits
from app.backend.gateway.engine_status import EngineStatus
from tests.gateway.conftest import SERVED, FixedSource, key_refused, running_requests
from tests.polling import wait_for

MSG = [{"role": "user", "content": "Say something about mixtures of experts."}]


def _usage_row(gw, name: str) -> dict:
    return next(i.as_json() for i in KeyStore(gw.data / ".moet-panel").infos() if i.name == name)


def test_streaming_chat_counts_the_engines_usage_and_hides_the_usage_chunk(make_gateway):
    gw = make_gateway()
    key = gw.key("laptop")
    with gw.client(key) as c:
        chunks = list(c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=40, stream=True))
    text = "".join((ch.choices[0].delta.content or "") + (getattr(ch.choices[0].delta, "reasoning", None) or "")
                   for ch in chunks if ch.choices)
    assert text, "no content streamed through the gateway"
    # the client did not ask for usage: no usage-only chunk reaches it
    assert all(ch.choices for ch in chunks), "the injected usage chunk leaked to a client that did not ask"
    assert all(getattr(ch, "usage", None) is None for ch in chunks)
    # the same request straight to the engine, with usage asked: the gateway counted exactly that
    with openai.OpenAI(base_url=gw.sim.base_url + "/v1", api_key="EMPTY", max_retries=0) as direct:
        last = list(direct.chat.completions.create(model=SERVED, messages=MSG, max_tokens=40, stream=True,
                                                   stream_options={"include_usage": True}))[-1]
    row = wait_for(lambda: (r := _usage_row(gw, "laptop"))["requests"] == 1 and r, 3, "usage flushed")
    assert row["prompt_tokens"] == last.usage.prompt_tokens
    assert row["completion_tokens"] == last.usage.completion_tokens == 40
    assert row["errors"] == 0 and row["last_used"] is not None


def test_streaming_with_usage_asked_passes_it_through(make_gateway):
    gw = make_gateway()
    with gw.client(gw.key("ide")) as c:
        chunks = list(c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=12, stream=True,
                                                stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    row = wait_for(lambda: (r := _usage_row(gw, "ide"))["requests"] == 1 and r, 3, "usage flushed")
    assert (row["prompt_tokens"], row["completion_tokens"]) == (chunks[-1].usage.prompt_tokens, 12)


def test_non_streaming_chat_and_completions_and_models(make_gateway):
    gw = make_gateway()
    with gw.client(gw.key("script")) as c:
        assert [m.id for m in c.models.list().data] == [SERVED]
        r = c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=9)
        msg = r.choices[0].message
        assert (msg.content or getattr(msg, "reasoning", None)) and r.usage.completion_tokens == 9
        t = c.completions.create(model=SERVED, prompt="The expert pool", max_tokens=5)
        assert t.usage.completion_tokens == 5
    row = wait_for(lambda: (r2 := _usage_row(gw, "script"))["requests"] == 3 and r2, 3, "usage flushed")
    assert row["completion_tokens"] == 14
    assert row["prompt_tokens"] == r.usage.prompt_tokens + t.usage.prompt_tokens
    acts = wait_for(lambda: len(a := gw.keys.activity(10)) == 3 and a, 3, "three activity records")
    assert {a.route for a in acts} == {"GET /v1/models", "POST /v1/chat/completions", "POST /v1/completions"}
    chat = next(a for a in acts if a.route == "POST /v1/chat/completions")
    assert chat.status == 200 and chat.completion_tokens == 9 and chat.duration_s > 0
    assert chat.request_body is None and chat.response_body is None  # metadata only by default


def test_body_capture_is_opt_in_and_capped(make_gateway):
    gw = make_gateway(limits=Limits(capture_bodies=True, capture_cap_bytes=64))
    with gw.client(gw.key("cap")) as c:
        c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=30)
    a = wait_for(lambda: gw.keys.activity(1), 3, "the activity record")[0]
    assert a.request_body is not None and len(a.request_body) == 64 and a.request_body.startswith('{"')
    assert a.response_body is not None and 0 < len(a.response_body) <= 64


def test_no_wrong_expired_and_revoked_keys_are_401(make_gateway):
    gw = make_gateway(limits=Limits(rate_per_min=1e6))  # the polls below are not rate-limited
    good = gw.key("good")
    r = httpx.get(gw.url + "/v1/models")
    assert r.status_code == 401 and "Authorization: Bearer" in r.json()["error"]["message"]
    with gw.client(good[:-2] + "xx") as c, pytest.raises(openai.AuthenticationError):
        c.models.list()
    with gw.client("Bearer " + good) as c, pytest.raises(openai.AuthenticationError):
        c.models.list()
    # expiry: a key that expires 0.5 s after creation works, then is refused
    short = gw.key("short", expires_days=0.5 / 86400)
    with gw.client(short) as c:
        wait_for(lambda: key_refused(c), 3, "the expired key to be refused")
    # revocation from another process's connection (as `moet-panel keys revoke` does) holds within 1 s
    with gw.client(good) as c:
        assert c.models.list().data
        other = KeyStore(gw.data / ".moet-panel")
        assert other.revoke("good")
        revoked_at = time.monotonic()
        wait_for(lambda: key_refused(c), 1.0, "the revoked key to be refused within 1 s")
        assert time.monotonic() - revoked_at < 1.0
        other.close()


ENGINE_ROUTES = ["/pause", "/resume", "/abort_requests", "/update_weights", "/tokenize", "/detokenize",
                 "/invocations", "/metrics", "/health", "/version", "/ping", "/load", "/v1/embeddings",
                 "/v1/responses", "/v1/score", "/rerank", "/v1/audio/transcriptions", "/collective_rpc",
                 "/reset_prefix_cache", "/sleep", "/wake_up", "/is_sleeping", "/server_info", "/scale_elastic_ep",
                 "/", "/docs", "/openapi.json", "/v1/chat/completions/", "/v1//models", "/v1/models/../../metrics",
                 "/V1/MODELS", "/v1/models%2F..%2Fmetrics"]


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_every_other_route_is_404(make_gateway, method):
    gw = make_gateway()
    key = gw.key("probe")
    with httpx.Client(base_url=gw.url, headers={"Authorization": f"Bearer {key}"}) as h:
        for route in ENGINE_ROUTES:
            r = h.request(method, route, json={} if method == "POST" else None)
            assert r.status_code == 404, f"{method} {route} -> {r.status_code}"
        # and without a key as well: nothing behind the gateway but the three routes
        r = httpx.post(gw.url + "/pause")
        assert r.status_code == 404
        r = h.post("/v1/models")
        assert r.status_code == 405


def test_429_at_the_concurrency_limit_with_retry_after(make_gateway):
    gw = make_gateway(limits=Limits(max_concurrent=2, rate_per_min=6000), decode_tok_s=20.0)
    key = gw.key("busy")
    with gw.client(key) as c:
        streams = [c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=400, stream=True) for _ in range(2)]
        try:
            for s in streams:
                next(iter(s))
            with pytest.raises(openai.RateLimitError) as ei:
                c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=2)
            assert int(ei.value.response.headers["retry-after"]) >= 1
            # another key is not held back by this one
            with gw.client(gw.key("other")) as c2:
                assert c2.chat.completions.create(model=SERVED, messages=MSG, max_tokens=2).usage.completion_tokens == 2
        finally:
            for s in streams:
                s.close()
    wait_for(lambda: running_requests(gw.sim) == 0, 5, "the closed streams to be aborted")
    with gw.client(key) as c:  # the slots are free again
        assert c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=2).usage.completion_tokens == 2


def test_429_at_the_rate_limit(make_gateway):
    gw = make_gateway(limits=Limits(max_concurrent=1, rate_per_min=1))  # burst 2, then one a minute
    with gw.client(gw.key("slow")) as c:
        c.models.list()
        c.models.list()
        with pytest.raises(openai.RateLimitError) as ei:
            c.models.list()
    assert int(ei.value.response.headers["retry-after"]) > 30


def test_503_with_the_reason_while_switching_and_while_booting(make_gateway, make_sim):
    src = FixedSource(EngineStatus(False, "http://127.0.0.1:9", SERVED,
                                   "the engine is stopping or switching profile; try again in a minute", "stopping"))
    gw = make_gateway(source=src)
    key = gw.key("w")
    with gw.client(key, timeout=5) as c:
        t0 = time.monotonic()
        with pytest.raises(openai.InternalServerError) as ei:
            c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=4, stream=True)
        assert time.monotonic() - t0 < 5  # answered, never a hang
        assert ei.value.status_code == 503 and "switching" in str(ei.value)
        # when the engine is back is unknown here: no Retry-After (a fixed guess made the SDK's retries hang)
        assert "retry-after" not in ei.value.response.headers
        src.value = EngineStatus(False, "http://127.0.0.1:9", SERVED, "switching", "stopping", retry_after_s=41.2)
        with pytest.raises(openai.InternalServerError) as ei:
            c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=4)
        assert ei.value.response.headers["retry-after"] == "42"
    # standalone: the probe sees an engine that is still loading (/health 503)
    booting = make_sim(ready=False, boot_s=30)
    gw2 = make_gateway(sim=booting)
    with gw2.client(gw2.key("b"), timeout=5) as c, pytest.raises(openai.InternalServerError) as ei:
        c.models.list()
    assert ei.value.status_code == 503 and "starting" in str(ei.value)


def test_client_disconnect_aborts_the_engine_request(make_gateway):
    gw = make_gateway(decode_tok_s=30.0)
    with gw.client(gw.key("dc")) as c:
        stream = c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=2000, stream=True)
        it = iter(stream)
        for _ in range(3):
            next(it)
        assert running_requests(gw.sim) == 1
        stream.close()
    wait_for(lambda: running_requests(gw.sim) == 0, 5, "the engine's running requests back to 0")
    assert gw.sim.stats.aborted == 1
    act = wait_for(lambda: [a for a in gw.keys.activity(5) if a.key_name == "dc"], 3, "the activity record")
    assert act[0].status == 499


def _raw(gw, data: bytes, read: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", gw.server.port), timeout=10) as s:
        s.sendall(data)
        if not read:
            return b""
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out


def test_bad_input_gets_a_clear_4xx_and_others_are_unaffected(make_gateway):
    gw = make_gateway(limits=Limits(max_body_bytes=64 * 1024, body_timeout_s=1.0, header_timeout_s=1.0))
    key = gw.key("fuzz")
    auth = {"Authorization": f"Bearer {key}"}
    url = gw.url + "/v1/chat/completions"
    cases = [
        (b'{"model": "x", "messages": [', "application/json", 400, "not valid JSON"),
        (b'[1, 2]', "application/json", 400, "JSON object"),
        (json.dumps({"model": SERVED, "messages": MSG}).encode(), "text/plain", 415, "Content-Type: application/json"),
        (b'{"model": "\xff\xfe"}', "application/json", 400, "not UTF-8"),
        (b"x" * (64 * 1024 + 1), "application/json", 413, "over 65536 bytes"),
    ]
    for body, ctype, status, words in cases:
        r = httpx.post(url, content=body, headers={**auth, "Content-Type": ctype})
        assert r.status_code == status, (body[:20], r.status_code, r.text)
        assert words in r.json()["error"]["message"]
    # header injection through a key name is refused at creation, in the store and in the CLI
    for bad in ("a\r\nX-Evil: 1", "name with space", "../x", "", "x" * 65, "é"):
        with pytest.raises(KeyStoreError):
            gw.keys.create(bad)
    # an Authorization header carrying CR/LF-looking junk is just a wrong key
    resp = _raw(gw, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() + b"%0d%0aX: y\r\n"
                    b"Connection: close\r\n\r\n")
    assert resp.startswith(b"HTTP/1.1 401")
    # a slow client (headers, then a body that never comes) is cut off, and a normal client meanwhile is served
    slow_result: list[bytes] = []
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{").encode()
    t = threading.Thread(target=lambda: slow_result.append(_raw(gw, head)))
    t.start()
    with gw.client(key) as c:
        assert c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=3).usage.completion_tokens == 3
    t.join(15)
    assert slow_result and slow_result[0].startswith(b"HTTP/1.1 408"), slow_result
    # a client that sends its headers and stops (slowloris) is disconnected at the header deadline
    with socket.create_connection(("127.0.0.1", gw.server.port), timeout=10) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n")
        assert s.recv(100) == b""  # closed by the gateway (a timeout here would raise)
    # headers without end are refused at 64 KiB (431, closed), not buffered until the deadline
    with socket.create_connection(("127.0.0.1", gw.server.port), timeout=10) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 70_000)
        try:
            answer = s.recv(100)
        except ConnectionResetError:  # closed with bytes still unread: a reset instead of the answer
            answer = b"HTTP/1.1 431"
        assert answer.startswith(b"HTTP/1.1 431"), answer
    with gw.client(key) as c:  # still serving
        assert c.models.list().data


def test_keys_are_stored_hashed_private_and_never_in_the_activity(make_gateway):
    gw = make_gateway()
    key = gw.key("secret")
    with gw.client(key) as c:
        c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=3)
    gw.keys.flush()
    db = gw.data / ".moet-panel" / "gateway.sqlite"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    blob = b"".join(p.read_bytes() for p in db.parent.glob("gateway.sqlite*"))
    assert key.encode() not in blob and key[8:].encode() not in blob
    assert all(key not in repr(a) for a in gw.keys.activity(10))
    assert all(key not in json.dumps(i.as_json()) for i in gw.keys.infos())


def test_tls_from_a_certificate_and_key(make_gateway, make_sim, home_data, tmp_path):
    """A gateway given a certificate serves HTTPS (uvicorn's ssl options); the OpenAI SDK verifies it."""
    import subprocess

    from app.backend.gateway.engine_status import ProbeSource
    from app.backend.gateway.server import GatewayConfig, GatewayServer

    cert, pkey = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(pkey), "-out", str(cert)],
                   check=True, capture_output=True)
    sim = make_sim()
    keys = KeyStore(home_data / ".moet-panel")
    key = keys.create("tls").key
    server = GatewayServer(GatewayConfig(host="127.0.0.1", port=0, tls_cert=cert, tls_key=pkey), keys,
                           ProbeSource(sim.base_url, SERVED))
    server.start()
    try:
        assert server.wait_started(10) and server.url.startswith("https://")
        with openai.OpenAI(base_url=f"https://127.0.0.1:{server.port}/v1", api_key=key, max_retries=0,
                           http_client=httpx.Client(verify=str(cert))) as c:
            assert [m.id for m in c.models.list().data] == [SERVED]
        with pytest.raises(httpx.HTTPError):  # plain HTTP to the TLS port is no way in
            httpx.get(f"http://127.0.0.1:{server.port}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=5)
    finally:
        server.stop()
        keys.close()
