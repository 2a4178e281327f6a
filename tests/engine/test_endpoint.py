"""The engine's one address rule (app/backend/recipe/endpoint.py, docs/engine.md "Where the engine listens",
issue 40): a unix socket in a 0700 directory of the state dir, or host:port for an engine without --uds; every
client (engine client, probes, canary, chat SDK, gateway upstream) reaches the SIMULATED engine on its socket."""

from __future__ import annotations

import io
import os
import shutil
import socket
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.aio import run_async
from app.backend.chat.client import SamplingParams
from app.backend.chat.snippets import curl_snippet, python_snippet
from app.backend.engine.runtime import client as ec
from app.backend.engine.supervision.canary import send_canary
from app.backend.engine.logs.loglines import is_panel_probe
from app.backend.engine.lifecycle.preflight import PreflightInputs, run_preflight
from app.backend.engine.runtime.readiness import claim_listen_address, probe
from app.backend.gateway.upstream import UpstreamPool
from app.backend.recipe import SIMULATED_RECIPE, load_recipe
from app.backend.recipe.command import CommandError, build_run_spec
from app.backend.recipe.endpoint import (SUN_PATH_MAX, EndpointError, EngineEndpoint, engine_endpoint,
                                         ensure_socket_dir, socket_dir)
from app.backend.recipe.schema import ProfileSpec
from app.backend.simengine import SimEngineServer
from app.backend.simengine.config import SimEngineConfig

NOBODY = 65534


@pytest.fixture
def home_dir() -> Iterator[Path]:
    d = Path.home() / f"moet-test-uds-{uuid.uuid4().hex[:8]}"
    d.mkdir(mode=0o700)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_endpoint_rule_parses_both_forms_and_refuses_the_rest() -> None:
    ep = EngineEndpoint.parse("unix:/d/.moet-panel/engine-sock/engine.sock")
    assert ep.is_uds and ep.uds == "/d/.moet-panel/engine-sock/engine.sock"
    assert ep.address == "unix:/d/.moet-panel/engine-sock/engine.sock" and ep.url == "http://engine"
    assert EngineEndpoint.parse("unix:///d/e.sock/v1/") == EngineEndpoint.unix("/d/e.sock")
    for text in ("http://127.0.0.1:8000", "http://127.0.0.1:8000/", " http://127.0.0.1:8000/v1/ "):
        assert EngineEndpoint.parse(text) == EngineEndpoint(host="127.0.0.1", port=8000)
    assert EngineEndpoint.tcp("0.0.0.0", 9).address == "http://127.0.0.1:9"  # a wildcard is reached on loopback
    assert EngineEndpoint.tcp("::1", 9).address == "http://[::1]:9"
    for bad in ("unix:engine.sock", "https://h:1", "http://h:1/prefix", "ftp://h", "http://h:99999", ""):
        with pytest.raises(EndpointError):
            EngineEndpoint.parse(bad)
    # the client's string helpers follow it: a socket address keeps its text form, requests go to http://engine
    assert ec.server_root("unix:/d/e.sock") == "unix:/d/e.sock" and ec.api_base("unix:/d/e.sock") == "http://engine/v1"
    assert ec.is_loopback("unix:/d/e.sock") and ec.is_uds("unix:/d/e.sock") and not ec.is_uds("http://h:1")


def test_each_recipe_listens_where_its_serve_table_says() -> None:
    recipe = load_recipe(SIMULATED_RECIPE)
    assert recipe.serve.listen == "uds"  # the default, for every shipped recipe
    assert engine_endpoint(recipe, "/data/x") == EngineEndpoint.unix("/data/x/.moet-panel/engine-sock/engine.sock")
    tcp = recipe.model_copy(update={"serve": recipe.serve.model_copy(update={"listen": "tcp"})})
    assert engine_endpoint(tcp, "/data/x") == EngineEndpoint(host="127.0.0.1", port=recipe.serve.port)
    spec = build_run_spec(tcp, "quality", "/data/x")  # a TCP engine: loopback, no socket, no mount
    assert spec.args[-2:] == ("--host", "127.0.0.1") and spec.socket_mount is None and "--uds" not in spec.args
    # a custom profile cannot move the engine off its socket
    base = recipe.profile("quality")
    with pytest.raises(ValueError, match="--uds"):
        ProfileSpec.model_validate({**base.model_dump(), "id": "x", "number": 9, "args_set": {"--uds": "/tmp/s"}})


def test_a_data_dir_too_deep_for_a_socket_gets_a_short_one_of_its_own(monkeypatch: pytest.MonkeyPatch,
                                                                          home_dir: Path) -> None:
    """A deep data dir (a test's, a user's) still serves: its socket moves to the cache home, one per data dir."""
    recipe = load_recipe(SIMULATED_RECIPE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(home_dir / ".cache"))
    deep_a, deep_b = "/data/" + "d" * (SUN_PATH_MAX - 40), "/data/" + "e" * (SUN_PATH_MAX - 40)
    a = EngineEndpoint.parse(engine_endpoint(recipe, deep_a).address).uds
    assert a.startswith(str(home_dir / ".cache" / "moet-sock-")) and len(a) <= SUN_PATH_MAX
    assert a == EngineEndpoint.parse(engine_endpoint(recipe, deep_a).address).uds  # every process agrees
    assert a != EngineEndpoint.parse(engine_endpoint(recipe, deep_b).address).uds
    assert "--uds" in build_run_spec(recipe, "quality", deep_a).argv()


def test_a_socket_path_too_long_to_bind_is_a_clear_error_before_any_start(monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = load_recipe(SIMULATED_RECIPE)
    long_dir = "/data/" + "d" * (SUN_PATH_MAX - 40)
    monkeypatch.setenv("XDG_CACHE_HOME", "/c" + "c" * SUN_PATH_MAX)  # the fallback is too deep as well
    with pytest.raises(EndpointError, match="shorter data dir"):
        engine_endpoint(recipe, long_dir)
    with pytest.raises(CommandError, match="at most 107"):
        build_run_spec(recipe, "quality", long_dir)
    report = run_preflight(PreflightInputs(recipe, {}, Path(long_dir), None, runtime_error="no docker here"))
    item = next(i for i in report.items if i.id == "socket")
    assert item.status == "fail" and "shorter data dir" in item.fix


def test_claiming_the_socket_makes_its_dir_0700_clears_a_dead_socket_and_refuses_a_live_one(home_dir: Path) -> None:
    recipe = load_recipe(SIMULATED_RECIPE)
    address = engine_endpoint(recipe, home_dir).address
    sock = Path(EngineEndpoint.parse(address).uds)
    assert claim_listen_address(address) == ""
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700 and stat.S_IMODE(sock.parent.parent.stat().st_mode) == 0o700
    sock.parent.chmod(0o755)  # an older, looser one is tightened
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(sock))
    dead.close()  # a socket file nobody listens on: an engine that died (vLLM's bind would fail on it)
    assert claim_listen_address(address) == "" and not sock.exists()
    assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(sock))
        live.listen()
        assert "already answers" in claim_listen_address(address)
        assert sock.exists()
    sock.unlink()
    if os.geteuid() == 0:  # a directory another user made there is refused, not used
        os.chown(sock.parent, NOBODY, NOBODY)
        assert "belongs to uid 65534" in claim_listen_address(address)
        report = run_preflight(PreflightInputs(recipe, {}, home_dir, None, runtime_error="no docker here"))
        assert next(i for i in report.items if i.id == "socket").status == "fail"


def _tcp_listeners() -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def test_every_client_reaches_the_simulated_engine_on_its_socket_and_it_opens_no_tcp_port(home_dir: Path) -> None:
    sock = str(ensure_socket_dir(socket_dir(home_dir)) / "engine.sock")
    before = _tcp_listeners()
    log = io.StringIO()
    server = SimEngineServer(SimEngineConfig(uds=sock, port=8000, boot_s=0.0, decode_tok_s=2000.0), log=log).start()
    try:
        assert server.wait_ready(10), "the simulated engine did not become ready"
        url = server.base_url
        assert url == f"unix:{sock}" and server.port == 0
        assert _tcp_listeners() == before, "the simulated engine opened a TCP port beside its socket"
        assert stat.S_ISSOCK(os.stat(sock).st_mode)
        # the engine client's reads, the readiness probe and the canary (its own connection)
        c = ec.engine_client(url)
        assert c.base_url == url and c.health() == 200 and server.config.served_name in c.models()
        assert "vllm:generation_tokens" in c.metrics().text
        assert c.tokenize(server.config.served_name, [{"role": "user", "content": "hi there"}]) > 0
        p = probe(url, server.config.served_name)
        assert p.health_ok and p.models_ok, p
        assert send_canary(url, server.config.served_name, 5.0).outcome == "ok"
        # the chat: the openai SDK over the socket
        with c.stream_chat({"model": server.config.served_name, "max_tokens": 4,
                            "messages": [{"role": "user", "content": "hi"}]}) as stream:
            chunks = list(stream)
        assert any(ch.get("choices") for ch in chunks) and any(ch.get("usage") for ch in chunks)
        # the gateway's upstream: asyncio's unix connection, Host: engine

        async def through_gateway() -> tuple[int, bytes]:
            pool = UpstreamPool()
            try:
                resp = await pool.request(url, "GET", "/v1/models", {})
                body = await resp.read()
                return resp.status_code, body
            finally:
                await pool.aclose()

        status, body = run_async(through_gateway)
        assert status == 200 and server.config.served_name.encode() in body
        # its access lines carry no client address (as uvicorn's on a socket): still known as the panel's probes
        probes = [ln for ln in log.getvalue().splitlines() if '"GET /health' in ln]
        assert probes and all(is_panel_probe(ln) for ln in probes), probes[:2]
        assert "Starting vLLM API server 0 on unix:" in log.getvalue()
    finally:
        server.stop()


def test_the_chat_snippets_use_the_socket() -> None:
    s = SamplingParams(temperature=1.0, top_p=1.0, min_p=0.05, max_tokens=None)
    curl = curl_snippet("unix:/d/.moet-panel/engine-sock/engine.sock", "m", s)
    assert curl.startswith("curl -N --unix-socket /d/.moet-panel/engine-sock/engine.sock http://engine/v1/chat/completions")
    py = python_snippet("unix:/d/e.sock", "m", s)
    assert "httpx.HTTPTransport(uds='/d/e.sock')" in py and "base_url='http://engine/v1'" in py
    compile(py, "snippet", "exec")
    assert "--unix-socket" not in curl_snippet("http://127.0.0.1:8000", "m", s)
