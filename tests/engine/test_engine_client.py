"""The one engine client (docs/engine.md, "Engine client") against the SIMULATED engine, in-process."""

from __future__ import annotations

import io
from collections.abc import Iterator

import httpx
import pytest

from app.backend.engine.runtime import client as ec
from app.backend.recipe import SIMULATED_RECIPE, load_recipe
from app.backend.simengine import SimEngineServer
from app.backend.simengine.config import SimEngineConfig


@pytest.fixture
def sim() -> Iterator[SimEngineServer]:
    server = SimEngineServer(SimEngineConfig(port=0, boot_s=0.0, decode_tok_s=2000.0), log=io.StringIO()).start()
    try:
        assert server.wait_ready(10), "simulated engine did not become ready"
        yield server
    finally:
        server.stop()


def test_the_url_rule() -> None:
    assert [ec.connect_host(h) for h in ("0.0.0.0", "", "::", "10.0.0.5")] == ["127.0.0.1"] * 3 + ["10.0.0.5"]
    recipe = load_recipe(SIMULATED_RECIPE)
    # the panel's engine: on its socket in the data dir (issue 40); a recipe with listen = "tcp": host:port
    assert ec.base_url(recipe, "/data/x") == "unix:/data/x/.moet-panel/engine-sock/engine.sock"
    tcp = recipe.model_copy(update={"serve": recipe.serve.model_copy(update={"listen": "tcp"})})
    assert ec.base_url(tcp, "/data/x") == f"http://{ec.connect_host(recipe.serve.host)}:{recipe.serve.port}"
    for url in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", " http://h:8000/v1/ "):
        assert ec.api_base(url) == "http://h:8000/v1" and ec.server_root(url) == "http://h:8000"
    assert ec.is_loopback("http://127.0.0.1:1/v1") and not ec.is_loopback("https://api.example.com/v1")


def test_one_kept_alive_client_per_base_url() -> None:
    a = ec.engine_client("http://127.0.0.1:9/v1")
    assert ec.engine_client("http://127.0.0.1:9") is a and a.base_url == "http://127.0.0.1:9"
    assert ec.engine_client("http://127.0.0.1:10") is not a


def test_reads_against_the_simulated_engine(sim: SimEngineServer) -> None:
    c = ec.engine_client(sim.base_url)
    assert c.health() == 200
    assert sim.config.served_name in c.models()
    assert c.tokenize(sim.config.served_name, [{"role": "user", "content": "hello there"}]) > 0
    first = c.metrics()
    assert "vllm:num_requests_running" in first.text
    assert c.metrics(max_age_s=60.0) is first  # young enough: the liveness check shares the telemetry's read
    assert c.metrics() is not first  # max_age_s 0: a fresh GET


def test_stream_chat_yields_chunks_and_failures_are_typed(sim: SimEngineServer) -> None:
    c = ec.engine_client(sim.base_url)
    body = {"model": sim.config.served_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    with c.stream_chat(body) as stream:
        chunks = list(stream)
    assert chunks[-1].get("usage", {}).get("completion_tokens") == 8
    with pytest.raises(ec.StreamFailure) as refused:
        list(c.stream_chat({**body, "model": "no-such-model"}))
    assert refused.value.kind == "http" and refused.value.status_code == 404
    with pytest.raises(ec.StreamFailure) as nobody:
        list(ec.engine_client("http://127.0.0.1:9").stream_chat(body))
    assert nobody.value.kind == "connect" and "127.0.0.1:9" in nobody.value.message


def test_nothing_listening_raises_httpx_errors() -> None:
    c = ec.engine_client("http://127.0.0.1:9")
    with pytest.raises(httpx.ConnectError):
        c.health(timeout=0.5)
    with pytest.raises(httpx.ConnectError):
        c.metrics(timeout=0.5)
