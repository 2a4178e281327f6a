"""Issue 40 (and issue 39's drain, gateway side): the gateway holds against strangers, frees the engine on every
hang-up, is fair to every key, refuses bad input in OpenAI's shape, shows its refusals and drains before a stop.
The SIMULATED engine in-process, the real openai SDK and raw sockets; no sleeps as synchronisation."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time

import httpx
import openai
import pytest

from app.backend.gateway.keys import KeyStore
from app.backend.gateway.proxy import UNKNOWN_KEY, Limits
from app.backend.gateway.engine_status import EngineStatus
from tests.gateway.conftest import SERVED, FixedSource, engine_counts, running_requests
from tests.polling import wait_for

MSG = [{"role": "user", "content": "Say something about mixtures of experts."}]


def _post(gw, key: str | None, body: dict | bytes, timeout: float = 10.0) -> httpx.Response:
    return _post_url(gw.url, key, body, timeout)


def _post_url(url: str, key: str | None, body: dict | bytes, timeout: float = 10.0) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + "/v1/chat/completions", content=data, headers=headers, timeout=timeout)


def _openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, (r.status_code, r.text[:200])
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["code"] == status and err["message"] and err["type"]
    return err


def _raw_request(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            pass
        return out


# -- 1. strangers -------------------------------------------------------------------------------------------
def test_idle_connections_from_one_address_leave_keyed_requests_served(make_gateway):
    # a global cap below the flood: before, every keyed request got 503 once the idle flood held it
    gw = make_gateway(limits=Limits(max_connections=120, max_conn_per_source=16, first_header_timeout_s=1.0))
    key = gw.key("owner")
    idle: list[socket.socket] = []
    try:
        for _ in range(200):  # from the keyed client's own address: its flood must not shut it out
            try:
                idle.append(socket.create_connection(("127.0.0.1", gw.server.port), timeout=5))
            except OSError:
                break
        assert len(idle) == 200
        with gw.client(key, timeout=10) as c:
            for _ in range(3):
                assert c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=3).usage.completion_tokens == 3
        # the source never held more than its cap, and a stranger's idle connection is closed in seconds
        assert gw.server.guard.count("127.0.0.1") <= 16
        assert gw.server.app.metrics.refusals["evicted_idle"] >= 200 - 16
        fresh = socket.create_connection(("127.0.0.1", gw.server.port), timeout=5)
        idle.append(fresh)
        assert fresh.recv(100) == b""  # closed by the gateway (a timeout here would raise)
    finally:
        for s in idle:
            s.close()


# -- 2. hang-ups ------------------------------------------------------------------------------------------
def test_an_abandoned_non_streaming_request_frees_the_engine_and_bills_what_the_engine_did(make_gateway):
    gw = make_gateway(decode_tok_s=100.0)  # 2,000 tokens: 20 s of engine time for nobody, before
    key = gw.key("leaver")
    before = engine_counts(gw.sim)
    body = json.dumps({"model": SERVED, "messages": MSG, "max_tokens": 2000, "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", gw.server.port), timeout=10)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() +
              b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    wait_for(lambda: running_requests(gw.sim) == 1 and engine_counts(gw.sim)[1] > before[1] + 20, 5,
             "the engine to be generating the answer")
    s.close()
    gone = time.monotonic()
    wait_for(lambda: running_requests(gw.sim) == 0, 3, "the engine freed after the hang-up")
    freed_s = time.monotonic() - gone
    assert gw.sim.stats.aborted == 1
    act = wait_for(lambda: [a for a in gw.keys.activity(5) if a.key_name == "leaver"], 3, "the activity record")
    after = engine_counts(gw.sim)
    usage = next(i.usage for i in gw.keys.infos() if i.name == "leaver")
    # billed what the engine did: its prompt and the tokens it made before the abort (before: nothing)
    assert act[0].status == 499 and usage.completion_tokens > 20 and usage.prompt_tokens > 0
    # all of the prompt; of the answer, what the engine sent: the tokens it counted after the client's EOF (the step
    # in hand) are never written, as with real vLLM (docs/gateway.md, "Usage = what the engine did")
    assert usage.prompt_tokens == after[0] - before[0]
    assert 0 <= after[1] - before[1] - usage.completion_tokens <= 4, (usage, before, after)
    assert freed_s < 1.0, f"the engine ran on {freed_s:.2f} s after the hang-up"


def test_a_hang_up_while_queued_leaves_the_queue_and_never_reaches_the_engine(make_gateway):
    gw = make_gateway(limits=Limits(engine_slots=1), decode_tok_s=20.0)
    a, b = gw.key("a"), gw.key("b")
    with gw.client(a) as ca:
        stream = ca.chat.completions.create(model=SERVED, messages=MSG, max_tokens=400, stream=True)
        next(iter(stream))
        # the model list takes no engine sequence: answered while the one slot is busy, never queued
        assert httpx.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {b}"}, timeout=5).status_code == 200
        got: list[object] = []
        t = threading.Thread(target=lambda: got.append(_swallow(lambda: _post(gw, b, {"model": SERVED, "messages": MSG,
                                                                                      "max_tokens": 3}, timeout=1.0))))
        t.start()
        wait_for(lambda: len(gw.server.app.queue) == 1, 5, "the second request to wait in the queue")
        t.join(10)  # its client gave up after 1 s
        wait_for(lambda: len(gw.server.app.queue) == 0, 3, "the queue to forget the request whose client left")
        assert gw.sim.stats.requests == 1  # the engine never saw it
        stream.close()
    wait_for(lambda: running_requests(gw.sim) == 0, 3, "the stream aborted")
    assert gw.server.app.queue.busy == 0


def _swallow(fn):
    try:
        return fn()
    except Exception as exc:  # the client's own timeout: what this test provokes
        return exc


def test_revoking_a_key_ends_its_running_stream(make_gateway):
    gw = make_gateway(decode_tok_s=20.0)
    key = gw.key("gone")
    with gw.client(key) as c:
        stream = c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=2000, stream=True)
        it = iter(stream)
        next(it)
        KeyStore(gw.data / ".moet-panel").revoke("gone")  # another process's `keys revoke`
        wait_for(lambda: running_requests(gw.sim) == 0, 3, "the revoked key's stream ended at the engine")
        with pytest.raises(openai.APIError, match="revoked"):  # the error event on the stream, as the SDK reads it
            for _ in it:
                pass
    act = wait_for(lambda: [a for a in gw.keys.activity(10) if a.key_name == "gone" and a.status == 401], 3,
                   "the cut recorded")
    assert "revoked" in act[0].error


def test_a_client_that_stops_reading_is_cut_after_the_stall(make_gateway):
    gw = make_gateway(limits=Limits(stall_s=1.0, max_tokens=200000), decode_tok_s=4000.0)
    key = gw.key("sleepy")
    body = json.dumps({"model": SERVED, "messages": MSG, "max_tokens": 200000, "stream": True,
                       "ignore_eos": True}).encode()
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        s.connect(("127.0.0.1", gw.server.port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() +
                  b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        wait_for(lambda: running_requests(gw.sim) == 1, 5, "the stream to run")
        wait_for(lambda: running_requests(gw.sim) == 0, 60, "the stalled stream cut", interval=0.2)
    finally:
        s.close()
    act = wait_for(lambda: [a for a in gw.keys.activity(5) if a.key_name == "sleepy"], 3, "the activity record")
    assert act[0].status == 499 and "stopped reading" in act[0].error
    assert act[0].completion_tokens and act[0].completion_tokens < 200000  # billed what was sent


# -- 3. fairness ------------------------------------------------------------------------------------------
def test_two_keys_one_greedy_take_turns(make_gateway):
    gw = make_gateway(limits=Limits(engine_slots=1), decode_tok_s=100.0, max_num_seqs=1)
    greedy, polite = gw.key("greedy"), gw.key("polite")
    done: list[tuple[str, float]] = []
    lock = threading.Lock()

    def ask(key: str, name: str, n: int) -> None:
        r = _post(gw, key, {"model": SERVED, "messages": MSG, "max_tokens": n}, timeout=60)
        assert r.status_code == 200, r.text
        with lock:
            done.append((name, time.monotonic()))

    threads = [threading.Thread(target=ask, args=(greedy, "greedy", 40)) for _ in range(4)]
    for t in threads:
        t.start()
    wait_for(lambda: len(gw.server.app.queue) == 3, 10, "three greedy requests queued behind the first")
    tp = threading.Thread(target=ask, args=(polite, "polite", 3))
    tp.start()
    for t in (*threads, tp):
        t.join(60)
    order = [name for name, _ in sorted(done, key=lambda x: x[1])]
    assert len(order) == 5
    # the polite answer comes right after the greedy one that ran when it arrived (before: after all four)
    assert order.index("polite") <= 1, order


def test_max_tokens_over_the_cap_is_a_clear_400(make_gateway):
    gw = make_gateway(limits=Limits(max_tokens=100, context_tokens=1000))
    key = gw.key("capped")
    for field in ("max_tokens", "max_completion_tokens"):
        err = _openai_error(_post(gw, key, {"model": SERVED, "messages": MSG, field: 101}), 400)
        assert "cap of 100" in err["message"]
    assert _post(gw, key, {"model": SERVED, "messages": MSG, "max_tokens": 100}).status_code == 200
    # no limit asked: the cap is sent, not the rest of the context
    r = _post(gw, key, {"model": SERVED, "messages": MSG})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 100


# -- 4. strict inputs -------------------------------------------------------------------------------------
def test_strict_inputs_are_refused_in_openais_shape(make_gateway):
    gw = make_gateway()
    key = gw.key("strict")
    err = _openai_error(_post(gw, key, {"model": SERVED, "messages": MSG, "stream": "true", "max_tokens": 3}), 400)
    assert "boolean" in err["message"]
    deep = b'{"model": "x", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert "nested" in _openai_error(_post(gw, key, deep), 400)["message"]
    mid = {"model": SERVED, "messages": MSG, "x": json.loads("[" * 80 + "]" * 80)}
    assert "nested" in _openai_error(_post(gw, key, mid), 400)["message"]
    for size in (70_000, 120_000):  # the whole head in one write: before, processed (70 KB) and answered 200
        head = (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() +
                b"\r\nX-Pad: " + b"a" * size + b"\r\nConnection: close\r\n\r\n")
        out = _raw_request(gw.server.port, head)
        assert out.startswith(b"HTTP/1.1 431"), out[:80]
        assert json.loads(out.split(b"\r\n\r\n", 1)[1])["error"]["code"] == 431
    # the same head a few bytes at a time
    head = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 70_000 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", gw.server.port), timeout=10) as s:
        answer = b""
        try:
            for i in range(0, len(head), 7000):
                s.sendall(head[i:i + 7000])
            answer = s.recv(100)
        except (ConnectionResetError, BrokenPipeError):
            answer = b"HTTP/1.1 431"
        assert answer.startswith(b"HTTP/1.1 431"), answer
    assert _post(gw, key, {"model": SERVED, "messages": MSG, "max_tokens": 3}).status_code == 200


# -- 5. refusals visible ----------------------------------------------------------------------------------
def test_refusals_are_listed_counted_and_a_flood_cannot_fill_the_store(make_gateway, caplog):
    caplog.set_level(logging.INFO, logger="moet_panel")
    gw = make_gateway(limits=Limits(max_concurrent=1, rate_per_min=1))
    key = gw.key("limited")
    old = gw.key("old")
    gw.keys.revoke("old")
    t0 = time.monotonic()
    for _ in range(150):
        _openai_error(_post(gw, "mpk-wrong", {"model": SERVED, "messages": MSG}), 401)
    _openai_error(_post(gw, None, {}), 401)
    err = _openai_error(_post(gw, old, {"model": SERVED, "messages": MSG}), 401)
    assert "revoked" in err["message"]
    scraper = gw.keys.create("prometheus", scope="metrics").key  # opens the panel's /metrics, not the gateway
    _openai_error(_post(gw, scraper, {"model": SERVED, "messages": MSG}), 401)
    with gw.client(key) as c:
        c.models.list()
        c.models.list()
        with pytest.raises(openai.RateLimitError):
            c.models.list()
    m = gw.server.app.metrics
    assert m.refusals["bad_key"] == 151 and m.refusals["no_key"] == 1 and m.refusals["revoked_key"] == 1
    assert m.refusals["rate_limited"] == 1
    gw.server.app._refusals.log_every = 0.0  # the minute's line now: one line for the whole flood
    lines = wait_for(lambda: [r.getMessage() for r in caplog.records if "action=refused" in r.getMessage()], 3,
                     "the aggregated refusal line")
    assert len(lines) == 1 and "n_bad_key=151" in lines[0] and "n_rate_limited=1" in lines[0], lines
    gw.server.app.tick()  # the flood's summary row
    rows = gw.keys.activity(1000)
    listed = len([a for a in rows if a.key_name == UNKNOWN_KEY])
    assert listed <= 20 + 2 * (time.monotonic() - t0) + 2 < 150  # a burst, then 2 a second: not one per attempt
    assert any(a.key_name == "(refused)" and "more refused" in a.error for a in rows)
    infos = {i.name: i for i in gw.keys.infos()}
    assert infos["old"].usage.errors == 1  # the revoked key's attempt is in its error count
    assert infos["limited"].usage.errors == 1  # ... and the 429
    assert all(key not in repr(a) and old not in repr(a) for a in rows)


# -- 6. drain ---------------------------------------------------------------------------------------------
def test_a_stop_signal_lets_the_running_answer_finish_and_refuses_new_ones(make_gateway, make_sim):
    sim = make_sim(decode_tok_s=40.0)
    src = FixedSource(EngineStatus(True, sim.base_url, SERVED, state="ready"))
    gw = make_gateway(source=src, sim=sim)
    key = gw.key("drain")
    with gw.client(key) as c:
        stream = c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=60, stream=True,
                                           stream_options={"include_usage": True})
        it = iter(stream)
        next(it)
        assert gw.server.app.answers_in_flight() == 1
        src.value = EngineStatus(True, sim.base_url, SERVED, "the engine is about to switch", "ready", draining=True,
                                 retry_after_s=37.5)
        with pytest.raises(openai.InternalServerError) as ei:
            c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=3)
        assert ei.value.status_code == 503 and ei.value.response.headers["retry-after"] == "38"
        chunks = list(it)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 60  # whole
    assert any(ch.choices and ch.choices[0].finish_reason == "length" for ch in chunks)
    wait_for(lambda: gw.server.app.answers_in_flight() == 0, 3, "no answer in flight")


# -- the panel's side: answers in flight, figures, the operator's log -------------------------------------
def test_the_panels_gateway_reports_answers_in_flight_figures_and_logs_without_keys(home_data, make_sim, caplog):
    from prometheus_client import CollectorRegistry, generate_latest

    from app.backend.contracts import EngineSnapshot, EngineState
    from app.backend.gateway.gwmetrics import families
    from app.backend.gateway.server import GatewayConfig
    from app.backend.gateway.switch import GatewayService
    from tests.conftest import free_port

    caplog.set_level(logging.INFO, logger="moet_panel")
    sim = make_sim(decode_tok_s=40.0)
    snap = EngineSnapshot(state=EngineState.READY, base_url=sim.base_url, served_name=SERVED)
    state_dir = home_data / ".moet-panel"
    svc = GatewayService(state_dir, GatewayConfig(port=free_port()), lambda: snap, sim.base_url)
    try:
        assert svc.answers_in_flight() == 0
        svc.start()
        key = svc.create_key("reporter").key
        url = svc.snapshot().url
        with openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30) as c:
            stream = c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=80, stream=True)
            it = iter(stream)
            next(it)
            wait_for(lambda: svc.answers_in_flight() == 1, 5, "the child to report one answer in flight")
            list(it)
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=url + "/v1", api_key="mpk-nope", max_retries=0).models.list()
        wait_for(lambda: svc.answers_in_flight() == 0, 5, "the child to report none in flight")

        class _C:
            def collect(self):
                return families(*svc.metrics())

        def exported() -> str:
            reg = CollectorRegistry()
            reg.register(_C())  # type: ignore[arg-type]
            return generate_latest(reg).decode()

        def served() -> str | None:
            t = exported()
            # both in one report (every 2 s): the answer's record and the refusal that followed it
            ok = ('moet_panel_gateway_requests_total{key="reporter",status="200"} 1.0' in t
                  and 'moet_panel_gateway_refusals_total{reason="bad_key"} 1.0' in t)
            return t if ok else None

        text = wait_for(served, 10, "the figures on the panel's export")
        assert "moet_panel_gateway_ttft_seconds_bucket" in text and "moet_panel_gateway_up 1.0" in text
        def logged() -> str | None:
            p = state_dir / "panel.log"
            t = p.read_text() if p.exists() else ""
            return t if "component=gateway action=started" in t else None

        log = wait_for(logged, 5, "the child's lines in the operator's log")
        assert any("action=key_created" in r.getMessage() and "key_name=reporter" in r.getMessage()
                   for r in caplog.records)  # the panel's side (its own oplog sinks in a real panel)
        assert key not in log and key not in text and all(key not in r.getMessage() for r in caplog.records)
    finally:
        svc.close()


def test_strangers_from_many_addresses_cannot_fill_the_global_cap(make_gateway):
    # 127.0.0.0/8 is all loopback: each 127.0.0.N is a source of its own
    gw = make_gateway(limits=Limits(max_connections=80, max_conn_per_source=10, first_header_timeout_s=30.0))
    key = gw.key("owner")
    idle: list[socket.socket] = []
    try:
        for n in range(2, 14):  # 12 sources x 10 = 120 idle connections, over the global 80
            for _ in range(10):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind((f"127.0.0.{n}", 0))
                s.connect(("127.0.0.1", gw.server.port))
                idle.append(s)
        with gw.client(key, timeout=10) as c:
            assert c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=3).usage.completion_tokens == 3
        assert gw.server.guard.evicted >= 120 - 80
        assert gw.server.app.metrics.refusals["evicted_idle"] == gw.server.guard.evicted  # counted by reason
    finally:
        for s in idle:
            s.close()


def test_the_panels_draining_snapshot_reaches_its_gateway_process_and_the_answer_finishes_whole(home_data, make_sim):
    """The engine controller's snapshot says draining (a stop or switch waits): the panel pushes it to its gateway
    child; new requests get 503 with Retry-After from expected_back_s, the running stream ends whole."""
    from app.backend.contracts import EngineSnapshot, EngineState
    from app.backend.gateway.server import GatewayConfig
    from app.backend.gateway.switch import GatewayService
    from tests.conftest import free_port
    from tests.gateway.test_gateway_process import FakeEngine

    sim = make_sim(decode_tok_s=40.0)
    engine = FakeEngine(EngineSnapshot(state=EngineState.READY, base_url=sim.base_url, served_name=SERVED))
    svc = GatewayService(home_data / ".moet-panel", GatewayConfig(port=free_port()), engine.snapshot, sim.base_url,
                         subscribe=engine.on_change)
    try:
        svc.start()
        key = svc.create_key("drainer").key
        url = svc.snapshot().url
        with openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30) as c:
            stream = c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=80, stream=True,
                                               stream_options={"include_usage": True})
            it = iter(stream)
            next(it)
            wait_for(lambda: svc.answers_in_flight() == 1, 5, "one answer in flight, as the controller counts it")
            engine.become(state=EngineState.READY, draining=True, expected_back_s=29.2)

            def refused() -> httpx.Response | None:
                r = _post_url(url, key, {"model": SERVED, "messages": MSG, "max_tokens": 3})
                return r if r.status_code == 503 else None

            r = wait_for(refused, 5, "new requests refused while draining", interval=0.1)
            assert r.headers["retry-after"] == "30" and "about to stop or switch" in r.json()["error"]["message"]
            chunks = list(it)
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 80
        wait_for(lambda: svc.answers_in_flight() == 0, 5, "no answer in flight: the stop may go on")
    finally:
        svc.close()
