"""The gateway on a box of several GPUs (issue 43): the box's status, the choice of engine, and requests spread
over two real (in-process SIMULATED) engines; a GPU draining or gone refuses nobody while another serves."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

import httpx

from app.backend.gateway.proxy import GPU_HEADER, Limits
from app.backend.gateway.engine_status import EngineStatus, SnapshotSource
from app.backend.gateway.routing import BoxSource
from app.backend.gateway.routing import LeastBusy, Target, box_status
from app.backend.contracts import EngineSnapshot, EngineState
from tests.gateway.conftest import SERVED, FixedSource, Gw

A = EngineStatus(True, "unix:/s/engine.sock", SERVED, state="ready", slots=1, gpu=0)
B = EngineStatus(True, "unix:/s/gpu1.sock", SERVED, state="ready", slots=1, gpu=1)


def test_box_status_and_least_busy_choice() -> None:
    one = box_status([A])
    assert one == A and one.engines == ()  # a one-GPU box: that engine's status, as before
    box = box_status([A, B])
    assert box.accepts and box.slots == 2 and [e.gpu for e in box.engines] == [0, 1]
    lb = LeastBusy()
    first = lb.pick(box)
    assert first == Target(0, A.base_url)
    lb.began(first)
    assert lb.pick(box) == Target(1, B.base_url)  # GPU 0 has its one sequence busy
    assert lb.pick(box, avoid=[B.base_url]) == Target(0, A.base_url)
    assert lb.in_flight(0) == 1 and lb.in_flight(1) == 0
    lb.ended(first)
    drained = box_status([replace(A, draining=True, retry_after_s=30.0), B])
    assert drained.accepts and lb.pick(drained) == Target(1, B.base_url)
    left = box_status([A, replace(B, left_out=True)])
    assert left.slots == 1 and lb.pick(left, avoid=[A.base_url]) is None
    none = box_status([replace(A, draining=True, retry_after_s=30.0),
                       replace(B, ready=False, state="starting", reason="starting", retry_after_s=12.0)])
    assert not none.accepts and none.retry_after_s == 12.0 and "GPU 1: starting" in none.reason
    assert lb.pick(none) is None
    # the panel pushes the box's status to its gateway child as one line: the engines travel with it
    assert EngineStatus.from_line(box.to_line()) == box


def test_box_source_marks_each_gpu_and_the_left_out_one() -> None:
    snaps = {0: EngineSnapshot(state=EngineState.READY, base_url="unix:/s/engine.sock", profile_id="quality"),
             1: EngineSnapshot(state=EngineState.STARTING, base_url="unix:/s/gpu1.sock")}
    src = BoxSource([SnapshotSource(lambda g=g: snaps[g], "x", lambda p: 1, gpu=g) for g in (0, 1)],
                      left_out_fn=lambda: {0})
    st = src.status()
    assert [(e.gpu, e.accepts) for e in st.engines] == [(0, False), (1, False)] and not st.accepts
    assert st.engines[0].left_out


def _chat(gw: Gw, key: str, n: int = 30) -> httpx.Response:
    return httpx.post(gw.url + "/v1/chat/completions", timeout=60, headers={"Authorization": f"Bearer {key}"},
                      json={"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": n})


def test_two_engines_answer_at_once_and_a_gone_gpu_refuses_nobody(make_gateway: Callable[..., Gw], make_sim) -> None:
    sims = [make_sim(max_num_seqs=1, decode_tok_s=100.0), make_sim(max_num_seqs=1, decode_tok_s=100.0)]
    each = [EngineStatus(True, s.base_url, SERVED, state="ready", slots=1, gpu=g) for g, s in enumerate(sims)]
    source = FixedSource(box_status(each))
    gw = make_gateway(limits=Limits(engine_slots=1), source=source)
    key = gw.key("team")
    got: list[httpx.Response] = []
    threads = [threading.Thread(target=lambda: got.append(_chat(gw, key))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [r.status_code for r in got] == [200, 200]
    assert sorted(r.headers[GPU_HEADER.decode()] for r in got) == ["0", "1"]  # one on each GPU, at once
    # GPU 0 drains (a rolling switch): new requests go to GPU 1
    source.value = box_status([replace(each[0], draining=True, retry_after_s=20.0), each[1]])
    assert _chat(gw, key, 3).headers[GPU_HEADER.decode()] == "1"
    # GPU 0's engine went away before the status said so: the request is taken by GPU 1, not refused
    source.value = box_status(each)
    sims[0].stop()
    r = _chat(gw, key, 3)
    assert r.status_code == 200 and r.headers[GPU_HEADER.decode()] == "1", (r.text, r.headers)
    # nothing serves: 503 with the soonest expected return
    source.value = box_status([replace(e, draining=True, retry_after_s=9.0 + e.gpu) for e in each])
    r = _chat(gw, key, 3)
    assert r.status_code == 503 and r.headers["retry-after"] == "9"


def test_the_access_tab_shows_the_queue_and_where_requests_go() -> None:
    from app.backend.gateway.switch import GatewaySnapshot, GatewayState
    from app.ui.gateway import queue_line

    one = queue_line(GatewaySnapshot(GatewayState.ON, queue_length=3, queue_wait_mean_s=1.25))
    assert 'data-queue="3"' in one and "3 waiting; mean wait 1.25 s" in one and "GPU" not in one
    box = queue_line(GatewaySnapshot(GatewayState.ON, serving_gpus=(1, 2), in_flight_gpu=((0, 1), (1, 0))))
    assert "Serving GPUs: 1, 2" in box and "GPU 0: 1" in box
