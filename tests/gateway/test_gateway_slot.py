"""Issue 48 items 2-3 and issue 50 item 2: the engine's slot is the GPU's, not the reader's; a slow or bursting
reader is cut from what it acknowledges; caps per key; turns and usage by the engine's work. The SIMULATED engine
in-process at `--max-num-seqs 1`, raw sockets for the readers; no sleeps as synchronisation (the readers' own
pace is what is under test)."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import httpx
import openai

from app.backend.gateway.proxy import DEFAULT_MAX_TOKENS, Limits
from tests.gateway.conftest import SERVED, running_requests
from tests.polling import wait_for

TCP_CLOSE = 7  # struct tcp_info's tcpi_state of a reset connection
MSG = [{"role": "user", "content": "Say something about mixtures of experts."}]


def _counter(sim, name: str) -> float:
    text = urllib.request.urlopen(sim.base_url + "/metrics", timeout=5).read().decode()
    m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M)
    assert m, f"no {name} in /metrics"
    return float(m.group(1))


@dataclass
class SlowReader:
    """A client that asks for a long stream and takes it slowly: `chunk` bytes every `every_s`, `bursts` times
    (0: forever), then nothing. Its receive buffer is small, as a phone's or a congested link's is, so its TCP
    stack acknowledges only what it reads."""

    port: int
    key: str
    body: bytes
    chunk: int
    every_s: float
    bursts: int = 0
    got: int = 0
    last_read: float = 0.0
    cut_at: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect(("127.0.0.1", self.port))
        self.sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                          self.key.encode() + b"\r\nContent-Type: application/json\r\nContent-Length: " +
                          str(len(self.body)).encode() + b"\r\n\r\n" + self.body)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                if self.bursts and n >= self.bursts:
                    # reads nothing more: polls its connection's TCP state (a reset leaves unread data readable)
                    if self.stop.wait(0.05) or self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] == TCP_CLOSE:
                        break
                    continue
                data = self.sock.recv(self.chunk)
                if not data:
                    break
                self.got += len(data)
                self.last_read = time.monotonic()
                n += 1
                self.stop.wait(self.every_s)  # the reader's own pace
        except OSError:
            pass
        self.cut_at = time.monotonic()
        self.done.set()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def _stream_body(n: int) -> bytes:
    return json.dumps({"model": SERVED, "messages": MSG, "max_tokens": n, "stream": True, "ignore_eos": True}).encode()


def _polite_wait(gw, key: str) -> float:
    """Seconds until the polite key's first token (a 3-token stream, read to its end: a hang-up after the first
    token would abort the rest at the engine, as vLLM does)."""
    t0 = time.monotonic()
    waited = None
    with httpx.stream("POST", gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": SERVED, "messages": MSG, "max_tokens": 3, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if waited is None and ('"content":"' in line and '"content":""' not in line or '"reasoning":"' in line):
                waited = time.monotonic() - t0
    if waited is None:
        raise AssertionError("the polite answer had no token")
    return waited


def _beside_a_slow_reader(make_gateway, caplog, chunk: int, every_s: float, bursts: int) -> None:
    caplog.set_level(logging.INFO, logger="moet_panel")
    stall_s = 8.0
    # one answer of 2 s of engine time (~1 MB of events, one a token: the gateway reads at the engine's speed)
    tok_s, n = 2000.0, 4000
    gw = make_gateway(limits=Limits(engine_slots=1, stall_s=stall_s, max_tokens=n), decode_tok_s=tok_s, max_num_seqs=1)
    slow_key, polite = gw.key("slow"), gw.key("polite")
    reader = SlowReader(gw.server.port, slow_key, _stream_body(n), chunk, every_s, bursts)
    reader.start()
    try:
        wait_for(lambda: running_requests(gw.sim) == 1, 10, "the slow reader's answer at the engine")
        t_engine = time.monotonic()
        ended: list[float] = []  # when the engine finished the slow answer (its own pace on this box)
        watch = threading.Thread(target=lambda: ended.append(
            wait_for(lambda: gw.sim.stats.completed and time.monotonic() - t_engine, 60, "the slow answer's end")))
        watch.start()
        waited = _polite_wait(gw, polite)  # sent at once: it waits in the gateway's queue
        watch.join(60)
        answer_s = ended[0]
        # the polite key starts within one answer's time of the slow one, not when the slow reader is cut
        assert waited < answer_s + 2.0 < stall_s, f"polite waited {waited:.1f} s beside the slow reader"
        assert not reader.done.is_set()
        assert gw.sim.stats.aborted == 0  # the slow answer was finished by the engine, not cut there
        reader.done.wait(stall_s + answer_s + 15)
        assert reader.done.is_set(), "the slow reader was never cut"
        # cut within the stall time of the last byte its TCP stack took (the last read + its small buffer)
        idle = reader.cut_at - max(reader.last_read, t_engine)
        assert idle < stall_s + 2.5, f"cut {idle:.1f} s after it last read"
        assert reader.got < n * 100  # it did not get its whole answer: cut, not finished (before: never cut)
    finally:
        reader.close()
    act = wait_for(lambda: [a for a in gw.keys.activity(10) if a.key_name == "slow"], 5, "the slow reader's record")
    # held memory, not the engine: the answer was finished there (before: the stall cut only a blocked send, and
    # the kernel's 4 MiB send buffer took this whole answer, so the reader was never cut)
    assert act[0].status == 499 and "stopped reading" in act[0].error
    assert act[0].completion_tokens == n  # billed what the engine did: the whole answer
    assert any("action=cut" in r.getMessage() and "why=stalled" in r.getMessage() for r in caplog.records)


def test_a_polite_key_starts_beside_a_one_byte_a_second_reader_which_is_cut(make_gateway, caplog):
    # one byte a second for 4 s, then nothing
    _beside_a_slow_reader(make_gateway, caplog, chunk=1, every_s=1.0, bursts=4)


def test_a_polite_key_starts_beside_a_burst_reader_which_is_cut_once_it_stops(make_gateway, caplog):
    # the probe's reader took 64 KiB every 25 s against a 30 s stall; here every 4 s against 8 s, then stops
    _beside_a_slow_reader(make_gateway, caplog, chunk=65536, every_s=4.0, bursts=3)


# -- usage = what the engine did ----------------------------------------------------------------------------
def test_hang_ups_and_early_closes_bill_what_the_engine_counted(make_gateway):
    gw = make_gateway(decode_tok_s=200.0)
    key = gw.key("biller")
    before = (_counter(gw.sim, "vllm:prompt_tokens_total"), _counter(gw.sim, "vllm:generation_tokens_total"))
    with gw.client(key) as c:
        # a stream hung up mid-answer
        stream = c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=2000, stream=True, extra_body={
            "ignore_eos": True})
        it = iter(stream)
        for _ in range(20):
            next(it)
        stream.close()
        wait_for(lambda: running_requests(gw.sim) == 0, 5, "the hung-up stream aborted at the engine")
        # a stream closed at its finish_reason chunk, before the usage chunk the gateway asked for
        stream = c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=30, stream=True)
        for ch in stream:
            if ch.choices and ch.choices[0].finish_reason:
                break
        stream.close()
        # a stream read whole, and a non-streaming answer
        list(c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=12, stream=True))
        c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=7)
    wait_for(lambda: len([a for a in gw.keys.activity(10) if a.key_name == "biller"]) == 4, 5, "four records")
    after = (_counter(gw.sim, "vllm:prompt_tokens_total"), _counter(gw.sim, "vllm:generation_tokens_total"))
    usage = next(i.usage for i in gw.keys.infos() if i.name == "biller")
    assert gw.sim.stats.aborted >= 1
    # every prompt the engine processed is billed; of the hung-up stream, what the engine sent: the tokens it counted
    # after the client's EOF (the step in hand) are never written, as with real vLLM (0-3 measured there,
    # tests/real_engine test_gateway_bills_what_vllm_counted_through_hang_ups_and_early_closes; docs/gateway.md)
    assert usage.prompt_tokens == after[0] - before[0]
    assert 0 <= after[1] - before[1] - usage.completion_tokens <= 4, (usage, before, after)
    statuses = [a.status for a in gw.keys.activity(10) if a.key_name == "biller"]  # newest first
    assert statuses[:2] == [200, 200] and statuses[3] == 499  # the early close: 200 or 499, as the race goes


# -- caps ----------------------------------------------------------------------------------------------------
def test_the_default_cap_fits_a_shared_box_and_a_key_has_its_own(make_gateway):
    gw = make_gateway(decode_tok_s=4000.0)
    plain, big = gw.key("plain"), gw.key("big", max_tokens=6000)
    with gw.client(plain) as c:
        try:
            c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=DEFAULT_MAX_TOKENS + 1)
            raise AssertionError("over the default cap was served")
        except openai.BadRequestError as exc:
            assert f"cap of {DEFAULT_MAX_TOKENS}" in str(exc)
        c.chat.completions.create(model=SERVED, messages=MSG)  # no limit asked: the cap is sent for it
    assert gw.sim.stats.last_params.get("max_tokens") == DEFAULT_MAX_TOKENS
    with gw.client(big) as c:
        assert c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=5000, extra_body={
            "ignore_eos": True}).usage.completion_tokens == 5000
    assert gw.keys.set_max_tokens("big", 20)
    wait_for(lambda: _refused(gw, big, 21), 3, "the key's new cap applied by the running gateway")


def _refused(gw, key: str, n: int) -> bool:
    r = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=10,
                   json={"model": SERVED, "messages": MSG, "max_tokens": n})
    return r.status_code == 400 and "cap of 20" in r.text


def test_a_key_holding_the_engine_while_others_wait_is_ended_at_the_hold_cap(make_gateway, caplog):
    caplog.set_level(logging.INFO, logger="moet_panel")
    gw = make_gateway(limits=Limits(engine_slots=1, max_hold_s=1.0), decode_tok_s=100.0, max_num_seqs=1)
    hog, other = gw.key("hog", max_tokens=100000), gw.key("other")
    with gw.client(hog) as c:
        stream = c.chat.completions.create(model=SERVED, messages=MSG, max_tokens=50000, stream=True,
                                           extra_body={"ignore_eos": True})
        it = iter(stream)
        next(it)
        t0 = time.monotonic()
        r = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {other}"}, timeout=30,
                       json={"model": SERVED, "messages": MSG, "max_tokens": 3})
        assert r.status_code == 200 and time.monotonic() - t0 < 5.0  # 50,000 tokens would be 500 s
        try:
            for _ in it:
                pass
            raise AssertionError("the hog's stream ended without the cap's error")
        except openai.APIError as exc:
            assert "held the engine" in str(exc)
    act = wait_for(lambda: [a for a in gw.keys.activity(10) if a.key_name == "hog"], 5, "the hog's record")
    assert act[0].status == 429 and act[0].completion_tokens and act[0].completion_tokens < 50000
    assert any("why=held_the_engine" in r.getMessage() for r in caplog.records)


def test_a_non_streaming_answer_over_the_hold_cap_is_a_429(make_gateway):
    gw = make_gateway(limits=Limits(engine_slots=1, max_hold_s=1.0), decode_tok_s=100.0, max_num_seqs=1)
    hog, other = gw.key("hog", max_tokens=100000), gw.key("other")
    got: list[httpx.Response] = []
    t = threading.Thread(target=lambda: got.append(httpx.post(
        gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {hog}"}, timeout=60,
        json={"model": SERVED, "messages": MSG, "max_tokens": 50000, "ignore_eos": True})))
    t.start()
    try:
        wait_for(lambda: running_requests(gw.sim) == 1, 10, "the hog's answer at the engine")
        r = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {other}"}, timeout=30,
                       json={"model": SERVED, "messages": MSG, "max_tokens": 3})
        assert r.status_code == 200
    finally:
        t.join(60)
    assert got and got[0].status_code == 429 and "held the engine" in got[0].json()["error"]["message"]
    assert gw.sim.stats.aborted == 1  # ended at the engine, not left to run 500 s for nobody
    # billed what the engine did before the cut (the request went to the engine as a stream: its counts came)
    act = wait_for(lambda: [a for a in gw.keys.activity(10) if a.key_name == "hog"], 5, "the hog's record")
    assert act[0].status == 429 and act[0].prompt_tokens and act[0].completion_tokens


def test_the_engines_counts_are_read_from_every_chunk_and_kept_from_a_client_that_did_not_ask():
    from app.backend.gateway.proxy import GatewayApp, _Trace

    app = GatewayApp.__new__(GatewayApp)  # _event reads only the event and the trace
    compact = (b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":5,'
               b'"total_tokens":7,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}')
    t = _Trace()
    assert app._event(compact, t, "all") == b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}'
    assert (t.prompt_tokens, t.completion_tokens, t.usage_seen) == (5, 2, True)
    spaced = b'data: {"usage": {"prompt_tokens": 9, "completion_tokens": 3}, "choices": [{"index": 0, "delta": {}}]}'
    t = _Trace()
    assert app._event(spaced, t, "") == spaced  # asked for by its client: passed through, and counted
    assert (t.prompt_tokens, t.completion_tokens) == (9, 3)
    assert b"usage" not in (app._event(spaced, t, "chunks") or b"")
    final = b'data: {"id":"x","choices":[],"usage":{"prompt_tokens":5,"total_tokens":9,"completion_tokens":4}}'
    assert app._event(final, _Trace(), "chunks") == final and app._event(final, _Trace(), "all") is None
