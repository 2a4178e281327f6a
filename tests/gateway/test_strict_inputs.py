"""Issue 48, item 4: fields the gateway forwarded unchecked. `NaN` and `Infinity` literals for sampling floats
reached the engine; `n`, `best_of`, `min_tokens` and `prompt_logprobs` had no bounds; a body announced at
99,999,999,999 bytes held a keyed connection until the 30 s body deadline. Now each is a clear 4xx at once, in
OpenAI's shape, counted by its reason on /metrics (docs/gateway.md#bounds-and-errors). The SIMULATED engine
in-process, raw sockets where the SDK would not send the shape."""

from __future__ import annotations

import json
import socket
import time

import httpx
from prometheus_client import CollectorRegistry, generate_latest

from app.backend.gateway.gwmetrics import families
from app.backend.gateway.proxy import Limits
from tests.gateway.conftest import SERVED

MSG = [{"role": "user", "content": "Say something about mixtures of experts."}]
AT_ONCE_S = 3.0  # "at once" on a shared 2-core box; the code before waited the 30 s body deadline


def _post(url: str, key: str, body: bytes | dict, path: str = "/v1/chat/completions") -> tuple[httpx.Response, float]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    t0 = time.monotonic()
    r = httpx.post(url + path, content=data, timeout=60,
                   headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    return r, time.monotonic() - t0


def _refused(r: httpx.Response, took: float, status: int = 400) -> str:
    assert r.status_code == status, (r.status_code, r.text[:300])
    err = r.json()["error"]
    assert err["code"] == status and err["type"] == "invalid_request_error"
    assert took < AT_ONCE_S, took
    return str(err["message"])


def _exported(gw) -> str:
    class _C:
        def collect(self):
            return families(gw.server.app.metrics.as_json(), True)

    reg = CollectorRegistry()
    reg.register(_C())  # type: ignore[arg-type]
    return generate_latest(reg).decode()


def test_nan_and_infinity_are_a_400_at_the_gateway(make_gateway) -> None:
    gw = make_gateway()
    key = gw.key("floats")
    head = b'{"model": "' + SERVED.encode() + b'", "messages": ' + json.dumps(MSG).encode() + b', "max_tokens": 3, '
    shapes = [b'"temperature": NaN}', b'"temperature": Infinity}', b'"top_p": -Infinity}', b'"temperature": 1e999}',
              b'"logit_bias": {"17": NaN}}']
    for tail in shapes:
        message = _refused(*_post(gw.url, key, head + tail))
        assert "non-finite number" in message, message
    assert gw.server.app.metrics.refusals["non_finite_number"] == len(shapes)
    r, _ = _post(gw.url, key, head + b'"temperature": 0.5}')  # a finite one is served
    assert r.status_code == 200, r.text[:200]
    assert f'moet_panel_gateway_refusals_total{{reason="non_finite_number"}} {float(len(shapes))}' in _exported(gw)


def test_n_best_of_min_tokens_and_logprobs_are_bounded(make_gateway) -> None:
    gw = make_gateway(limits=Limits(max_tokens=400))
    key = gw.key("fields")
    chat = {"model": SERVED, "messages": MSG, "max_tokens": 3}
    completion = {"model": SERVED, "prompt": "Mixtures of experts", "max_tokens": 3}
    refused = [
        (chat | {"n": 5}, "/v1/chat/completions", "`n` must be 1"),
        (chat | {"n": 0}, "/v1/chat/completions", "`n` must be 1"),
        (completion | {"best_of": 4}, "/v1/completions", "`best_of` must be 1"),
        (completion | {"n": 2}, "/v1/completions", "`n` must be 1"),
        (chat | {"min_tokens": 10}, "/v1/chat/completions", "`min_tokens` must be an integer from 0 to 3"),
        ({"model": SERVED, "messages": MSG, "min_tokens": 500}, "/v1/chat/completions", "from 0 to 400"),
        (completion | {"logprobs": 20}, "/v1/completions", "`logprobs` must be an integer from 0 to 5"),
        (chat | {"logprobs": True, "top_logprobs": 20}, "/v1/chat/completions", "`top_logprobs`"),
        (completion | {"prompt_logprobs": -1}, "/v1/completions", "`prompt_logprobs`"),
        (chat | {"n": "5"}, "/v1/chat/completions", "not \"5\""),
    ]
    for body, path, expect in refused:
        message = _refused(*_post(gw.url, key, body, path))
        assert expect in message, (body, message)
    assert gw.server.app.metrics.refusals["out_of_bounds"] == len(refused)
    for body, path in ((chat | {"n": 1, "min_tokens": 2}, "/v1/chat/completions"),
                       (chat | {"logprobs": True, "top_logprobs": 2}, "/v1/chat/completions"),
                       (completion | {"best_of": 1, "logprobs": 1}, "/v1/completions")):
        r, _ = _post(gw.url, key, body, path)
        assert r.status_code == 200, (body, r.status_code, r.text[:200])
    assert f'moet_panel_gateway_refusals_total{{reason="out_of_bounds"}} {float(len(refused))}' in _exported(gw)


def test_a_huge_announced_body_is_a_413_before_it_is_read(make_gateway) -> None:
    gw = make_gateway()
    key = gw.key("big")
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() +
            b"\r\nContent-Type: application/json\r\nContent-Length: 99999999999\r\n\r\n")
    with socket.create_connection(("127.0.0.1", gw.server.port), timeout=10) as s:
        s.settimeout(AT_ONCE_S)
        t0 = time.monotonic()
        s.sendall(head + b'{"model": "' + SERVED.encode() + b'", "messages": [')  # and nothing more
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = s.recv(65536)  # a timeout here: the gateway waited for the body
            if not chunk:
                break
            answer += chunk
        took = time.monotonic() - t0
    assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
    err = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]
    assert err["code"] == 413 and "99999999999 bytes" in err["message"] and "limit" in err["message"]
    assert took < AT_ONCE_S, took
    assert gw.server.app.metrics.refusals["body_too_large"] == 1
    r = httpx.get(gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 405  # and a wrong method is counted too: every refusal has its reason
    text = _exported(gw)
    assert 'moet_panel_gateway_refusals_total{reason="body_too_large"} 1.0' in text
    assert 'moet_panel_gateway_refusals_total{reason="wrong_method"} 1.0' in text
