"""A box behind a fleet's front, and the front's checks, on loopback (docs/fleet.md): the fleet key's scope, the
unauthenticated health check, `moet-panel fleet add`'s refusals that change nothing, the front's allow-list
against the router's admin routes, the fleet's status and its Prometheus configuration."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.backend.fleet import fleetfile
from app.backend.fleet.boxes import BoxStatus
from app.backend.fleet.fleetfile import FleetError
from app.backend.fleet.front import make_front
from app.backend.fleet.manage import add_box, remove_box
from app.backend.fleet.promconfig import render
from app.backend.fleet.source import fleet_status
from app.backend.gateway.engine_status import EngineStatus
from tests.gateway.conftest import FixedSource, Gw, unsent
from tests.fleet.hangup import hang_up

SERVING = EngineStatus(True, "http://127.0.0.1:9", "deepseek-v4-flash", state="ready", slots=4)
DRAINING = EngineStatus(True, "http://127.0.0.1:9", "deepseek-v4-flash", "draining", "ready", draining=True)
STOPPED = EngineStatus(False, "http://127.0.0.1:9", "", "stopped", "stopped")
MONITORING = Path(__file__).resolve().parents[2] / "assets" / "monitoring"


def box(make_gateway: Callable[..., Gw], status: EngineStatus = SERVING) -> tuple[Gw, FixedSource, str]:
    src = FixedSource(status)
    gw = make_gateway(source=src)
    key = gw.keys.create("front", scope="fleet", key="mpk-" + "f" * 43).key
    return gw, src, key


def test_a_box_without_a_fleet_key_answers_as_before(make_gateway: Callable[..., Gw]) -> None:
    gw = make_gateway(source=FixedSource(SERVING))
    assert httpx.get(gw.url + "/health").status_code == 404
    assert httpx.get(gw.url + "/fleet/status").status_code == 404
    k = gw.key("owner")
    assert httpx.post(gw.url + "/fleet/end", headers={"Authorization": f"Bearer {k}"}).status_code == 404
    assert httpx.get(gw.url + "/v1/models", headers={"Authorization": f"Bearer {k}"}).status_code != 401


def test_a_fleet_box_answers_health_without_a_key_200_serving_503_draining_or_stopped(
        make_gateway: Callable[..., Gw]) -> None:
    gw, src, _ = box(make_gateway)
    r = httpx.get(gw.url + "/health")
    assert (r.status_code, r.json()) == (200, {"status": "serving"})
    src.value = DRAINING
    r = httpx.get(gw.url + "/health")
    assert (r.status_code, r.json()) == (503, {"status": "draining"})
    src.value = STOPPED
    assert httpx.get(gw.url + "/health").status_code == 503


def test_a_fleet_box_refuses_no_key_and_an_owners_inference_key_and_takes_the_fleet_key(
        make_gateway: Callable[..., Gw]) -> None:
    gw, _, fleet_key = box(make_gateway)
    owner = gw.key("owner")  # made before or after the fleet key: refused all the same
    for path in ("/v1/models", "/fleet/status"):
        assert httpx.get(gw.url + path).status_code == 401
        r = httpx.get(gw.url + path, headers={"Authorization": f"Bearer {owner}"})
        assert r.status_code == 401 and "front" in r.json()["error"]["message"]
    r = httpx.post(gw.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {owner}"},
                   json={"model": "x", "messages": []})
    assert r.status_code == 401
    r = httpx.get(gw.url + "/fleet/status", headers={"Authorization": f"Bearer {fleet_key}"})
    assert r.status_code == 200
    assert r.json()["serving"] is True and r.json()["slots"] == 4 and r.json()["served_name"] == "deepseek-v4-flash"


def _fleet(tmp: Path) -> fleetfile.FleetConfig:
    return fleetfile.new_fleet(tmp, router_port=9, router_metrics_port=9)


def test_fleet_add_refusals_name_the_cause_and_change_nothing(make_gateway: Callable[..., Gw], tmp_path: Path) -> None:
    gw, src, _ = box(make_gateway)
    cfg = _fleet(tmp_path)
    before = (tmp_path / fleetfile.FILE_NAME).read_bytes()
    with pytest.raises(FleetError, match="does not answer"):
        add_box(tmp_path, "b1", "http://127.0.0.1:9")
    with pytest.raises(FleetError, match="refused the fleet key"):
        add_box(tmp_path, "b1", gw.url)  # the box holds another fleet key
    assert (tmp_path / fleetfile.FILE_NAME).read_bytes() == before
    gw.keys.create("front2", scope="fleet", key=cfg.fleet_key)
    st, router = add_box(tmp_path, "b1", gw.url)
    assert st.serving and "not running" in router  # no router here: it takes the box when the front starts
    after = (tmp_path / fleetfile.FILE_NAME).read_bytes()
    with pytest.raises(FleetError, match="named 'b1'"):
        add_box(tmp_path, "b1", "http://127.0.0.1:10")
    with pytest.raises(FleetError, match="is box 'b1'"):
        add_box(tmp_path, "b2", gw.url)
    src.value = EngineStatus(True, "http://127.0.0.1:9", "another-model", state="ready")
    other = gw.url.replace("127.0.0.1", "localhost")  # the same box under another address: now serving another model
    with pytest.raises(FleetError, match="serves 'another-model'"):
        add_box(tmp_path, "b3", other)
    with pytest.raises(FleetError, match="box name"):
        add_box(tmp_path, "bad name", other)
    with pytest.raises(FleetError, match="not a gateway address"):
        add_box(tmp_path, "b4", "ftp://x/y")
    assert (tmp_path / fleetfile.FILE_NAME).read_bytes() == after
    assert [b.name for b in fleetfile.load(tmp_path).boxes] == ["b1"]  # type: ignore[union-attr]
    remove_box(tmp_path, "b1")
    assert fleetfile.load(tmp_path).boxes == ()  # type: ignore[union-attr]
    with pytest.raises(FleetError, match="no box named"):
        remove_box(tmp_path, "b1")


def test_the_front_forwards_no_admin_route_of_the_router_whatever_the_path_trick(
        make_gateway: Callable[..., Gw], tmp_path: Path) -> None:
    """The front is the gateway with an allow-list: the router's admin routes (same port as its inference) and
    every engine route stay 404, spelled any way."""
    from app.backend.fleet.source import FleetSource

    cfg = _fleet(tmp_path)
    gw = make_gateway(source=FixedSource(SERVING))
    make_front(gw.server, FleetSource(lambda: cfg), cfg.fleet_key)
    k = gw.key("client")
    auth = {"Authorization": f"Bearer {k}"}
    tricks = ["/add_worker?url=http://evil:1", "/remove_worker?url=x", "/workers", "/list_workers",
              "//add_worker", "/v1/../add_worker", "/v1/%2e%2e/add_worker", "/%61dd_worker", "/add_worker/",
              "/v1/chat/completions/../../add_worker", "/ADD_WORKER", "/v1/models/../../workers", "/health",
              "/metrics", "/get_load", "/flush_cache", "/v1/chat/completions/render"]
    for path in tricks:
        for method in ("GET", "POST", "DELETE"):
            r = httpx.request(method, gw.url + path, headers=auth)
            assert r.status_code == 404, (method, path, r.status_code)
    with httpx.Client() as c:  # a raw absolute-form target
        r = c.send(c.build_request("POST", gw.url + "/add_worker", headers=auth))
        assert r.status_code == 404


def test_the_fleets_status_sums_the_slots_of_serving_routed_boxes(tmp_path: Path) -> None:
    cfg = _fleet(tmp_path)
    boxes = [BoxStatus("a", True, True, "m", 2), BoxStatus("b", True, True, "m", 3),
             BoxStatus("c", True, False, "m", 5, draining=True), BoxStatus("d", False, error="does not answer")]
    st = fleet_status(cfg, boxes, True, {"a", "b", "c"})
    assert st.accepts and st.slots == 5 and st.served_name == "m" and st.base_url == cfg.router_url
    assert fleet_status(cfg, boxes, True, {"a"}).slots == 2  # b not (yet) healthy in the router
    down = fleet_status(cfg, boxes, False, None)
    assert not down.accepts and "router" in down.reason and down.retry_after_s > 0
    none = fleet_status(cfg, boxes[2:], True, {"c"})
    assert not none.accepts and "d: does not answer" in none.reason


def test_prometheus_config_labels_every_box_and_scrapes_the_router_promtool_checks_it(tmp_path: Path) -> None:
    cfg = _fleet(tmp_path)
    cfg = fleetfile.with_box(cfg, fleetfile.Box("b1", "http://10.0.0.2:8001", "http://10.0.0.2:7860/metrics", "s3cr3t-metrics-token"))
    cfg = fleetfile.with_box(cfg, fleetfile.Box("b2", "http://10.0.0.3:8001", "http://10.0.0.3:7860/metrics"))
    out = tmp_path / "prometheus.yml"
    out.write_text(render(cfg, rule_files=[str(MONITORING / "fleet-rules.yml")], token_dir=tmp_path))
    r = subprocess.run(["promtool", "check", "config", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads("\n".join(line for line in out.read_text().splitlines() if not line.startswith("#")))
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert jobs["moet-panel-b1"]["static_configs"][0]["labels"] == {"box": "b1"}
    assert jobs["moet-panel-b1"]["authorization"]["credentials_file"].endswith("fleet-b1.token")
    assert "s3cr3t" not in out.read_text()  # the token in a 0600 file, not in the configuration
    assert "authorization" not in jobs["moet-panel-b2"]
    assert jobs["vllm-router"]["static_configs"][0]["targets"] == ["127.0.0.1:9"]


def test_fleet_rules_pass_promtool_and_their_unit_tests() -> None:
    rules = MONITORING / "fleet-rules.yml"
    r = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(["promtool", "test", "rules", str(MONITORING / "fleet-tests" / "fleet-rules.test.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_fleet_tab_exists_only_on_a_front_and_shows_each_box() -> None:
    from types import SimpleNamespace

    from app.backend.fleet.service import BoxFigures, BoxView, FleetView
    from app.ui import fleet as tab

    assert not tab.shown(SimpleNamespace(front=None))  # type: ignore[arg-type]
    view = FleetView((BoxView(BoxStatus("b1", True, True, "m", 1, "ready", in_flight=2), True,
                              BoxFigures(("quality",), 70.5, 96.0, 0.57)),
                      BoxView(BoxStatus("b2", False, error="does not answer"), None)), router_pid=42, router_starts=2, asked=True)
    page = tab.fleet_html(view)
    for text in ("b1", "serving", "healthy", "quality", "70.5 / 96.0 GiB", "57%", "b2", "does not answer",
                 "not listed", "router pid 42"):
        assert text in page, text


class _RouterDouble:
    """A stand-in for the router on loopback: answers each chat request as `script` says, in turn ("503": a box's
    503 passed on; "closed": 200 and a stream's headers, then the connection closed before any byte of it, as a box
    that began to stop in that instant; "held": no answer, `on_held()` called, until the front closes the
    connection, as on a box cut off; "prefill": a stream's headers, then nothing until the front asks the box to end
    the request (`POST /fleet/end`, also answered here, as the box), then the engine's first chunk with its counts
    and the end, as a box whose engine ended its prefill as it was aborted; "silent": a stream's headers and first
    chunk, then nothing until the front closes, as a box cut off mid-answer; "slow:S": a stream's headers, S seconds
    of nothing (a long prompt's prefill), then as "ok"; "ok": a short stream); records the Authorization header of
    each."""

    def __init__(self, script: list[str], on_held: Callable[[], object] = lambda: None) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.seen: list[str] = []
        self.prefilling = threading.Event()  # a "prefill" request's headers sent
        self.ended: list[str] = []  # the request ids the front asked to end
        ended = threading.Event()
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path == "/fleet/end":
                    double.ended.append(self.headers.get("x-moet-request", ""))
                    ended.set()
                    self._send(200, b'{"ended":1}', "application/json")
                    return
                double.seen.append(self.headers.get("authorization", ""))
                how = script[len(double.seen) - 1] if len(double.seen) <= len(script) else "ok"
                if how == "prefill":
                    self._sse_head()
                    self.wfile.flush()
                    double.prefilling.set()
                    ended.wait(10)
                    usage = {"prompt_tokens": 4000, "completion_tokens": 1, "total_tokens": 4001}
                    ev = b"data: " + json.dumps({"id": "c1", "choices": [{"index": 0, "delta": {"role": "assistant"}}],
                                                 "usage": usage}, separators=(",", ":")).encode() + b"\n\n"
                    self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(ev), ev))
                    self.close_connection = True
                    return
                if how.startswith("slow:"):
                    self._sse_head()
                    self.wfile.flush()
                    time.sleep(float(how[5:]))  # the double's prefill; nothing here waits on it
                    ev = b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"hello"}}]}\n\ndata: [DONE]\n\n'
                    self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(ev), ev))
                    self.close_connection = True
                    return
                if how == "silent":
                    self._sse_head()
                    ev = b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"hel"}}]}\n\n'
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(ev), ev))
                    self.wfile.flush()
                    self.rfile.read(1)
                    self.close_connection = True
                    return
                if how == "held":
                    on_held()
                    self.rfile.read(1)  # b"" once the front closes its connection (it sent the request again)
                    self.close_connection = True
                    return
                if how == "closed":
                    self._sse_head()
                    self.close_connection = True
                    return
                if how == "503":
                    body, status, ctype = b'{"error":{"message":"draining"}}', 503, "application/json"
                else:
                    chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "deepseek-v4-flash",
                             "choices": [{"index": 0, "delta": {"content": "hello"}, "finish_reason": "stop"}]}
                    body = b"data: " + json.dumps(chunk).encode() + b"\n\ndata: [DONE]\n\n"
                    status, ctype = 200, "text/event-stream"
                self._send(status, body, ctype)

            def _sse_head(self) -> None:  # a stream's headers: 200, chunked
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()

            def _send(self, status: int, body: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _front_asks(home_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, script: list[str],
                stream: bool = True, idle_s: float = 0.0, first_s: float = 0.0,
                content: str = "hi") -> tuple[httpx.Response, list[str], str, list[str]]:
    """A front gateway (make_front) whose upstream is a router double answering as `script` says; one streamed chat
    request through it. Returns (the client's answer, the Authorization headers upstream saw, the fleet key, the
    operator log's lines). Everything started here is stopped, even on failure."""
    import asyncio
    import logging

    from app.backend.fleet.source import FleetSource
    from app.backend.gateway.keys import KeyStore
    from app.backend.gateway.proxy import Limits
    from app.backend.gateway.server import GatewayConfig, GatewayServer

    class Watched(FleetSource):
        loop: asyncio.AbstractEventLoop | None = None

        def box_lost(self) -> asyncio.Event:  # asked on the gateway's loop, for each attempt
            self.loop = asyncio.get_running_loop()
            return super().box_lost()

    caplog.set_level(logging.INFO, logger="moet_panel")
    cfg = _fleet(tmp_path)
    source = Watched(lambda: cfg)
    # "held": the front's watch of its boxes finds one lost (fleet/source.py), on the gateway's loop
    router = _RouterDouble(script, lambda: source.loop.call_soon_threadsafe(source.wake_waiting)  # type: ignore[union-attr]
                           )
    keys = KeyStore(home_data / ".moet-panel")
    server = GatewayServer(GatewayConfig(host="127.0.0.1", port=0, limits=Limits()), keys,
                           FixedSource(EngineStatus(True, router.url, "deepseek-v4-flash", state="ready", slots=4)))
    try:
        make_front(server, source, cfg.fleet_key)
        server.app.upstream_idle_s = idle_s or server.app.upstream_idle_s  # a box silent mid-answer: this bound
        server.app.upstream_first_s = first_s or server.app.upstream_first_s  # ... and before its first byte
        server.start()
        assert server.wait_started(10), f"gateway did not start: {server.error}"
        k = keys.create("client").key
        r = httpx.post(f"http://127.0.0.1:{server.port}/v1/chat/completions", headers={"Authorization": f"Bearer {k}"},
                       json={"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": content}],
                             "stream": stream}, timeout=20)
        return r, list(router.seen), cfg.fleet_key, [rec.getMessage() for rec in caplog.records]
    finally:
        server.stop()
        keys.close()
        router.close()


def test_the_front_sends_again_a_503_the_router_passes_on_and_the_client_gets_the_answer(
        home_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A box's 503 that the router passes on (it drained after the router's last health check) reached nothing of
    the client: the front sends the request again (proxy.GatewayApp._request) and the client gets the 200."""
    r, seen, fleet_key, log = _front_asks(home_data, tmp_path, caplog, ["503", "ok"])
    assert r.status_code == 200, r.text
    assert "hello" in r.text and "data: [DONE]" in r.text and "error" not in r.text
    assert seen == [f"Bearer {fleet_key}"] * 2  # the fleet key upstream, the request sent twice
    resent = [m for m in log if "action=resent_after_router_error" in m]
    assert len(resent) == 1 and "status=503" in resent[0], resent


def test_the_front_sends_again_a_stream_whose_box_closed_before_its_first_byte(
        home_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A box that began to stop in the instant it took a request sends a stream's headers, then closes: the front
    answers its client only from the first byte on, so it sends the request again instead of cutting the client."""
    r, seen, _, log = _front_asks(home_data, tmp_path, caplog, ["closed", "ok"])
    assert r.status_code == 200, r.text
    assert "hello" in r.text and "data: [DONE]" in r.text and "error" not in r.text
    assert len(seen) == 2
    assert len([m for m in log if "action=resent_after_box_closed" in m]) == 1


def test_a_non_streaming_answer_whose_box_went_silent_mid_answer_ends_with_a_502_at_the_front(
        home_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A front sends a non-streaming request to its boxes as a stream (docs/fleet.md "Usage at the front"); a box
    silent mid-answer ends it after the front's silence bound with a 502 JSON error, as a stream gets its error event,
    not a hang."""
    r, seen, _, _ = _front_asks(home_data, tmp_path, caplog, ["silent"], stream=False, idle_s=0.5)
    assert r.status_code == 502, r.text
    assert "the box answering stopped" in r.json()["error"]["message"]
    assert len(seen) == 1


@pytest.mark.parametrize("prompt_bytes, status", [(0, 502), (8000, 200)])
def test_the_fronts_bound_before_a_first_byte_grows_with_the_prompt_a_box_prefills(
        home_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, prompt_bytes: int, status: int) -> None:
    """A box that answers its stream's headers and then nothing for longer than the front's first-byte bound is ended
    with a 502; the bound grows by a second per 4,000 bytes of request (front.PREFILL_BYTES_PER_S), so a long prompt's
    prefill is waited for, not ended (30 s flat before: a 260,000-token prompt failed at the front after the box
    prefilled it). Here the bound is 0.5 s and the box's prefill 1.5 s; 8,000 bytes more give 2 s more."""
    from app.backend.fleet.front import PREFILL_BYTES_PER_S

    assert PREFILL_BYTES_PER_S == 4000.0
    r, seen, _, _ = _front_asks(home_data, tmp_path, caplog, ["slow:1.5"], first_s=0.5, content="x" * (prompt_bytes or 2))
    assert r.status_code == status, r.text
    assert ("hello" in r.text and "data: [DONE]" in r.text) if status == 200 else "error" in r.text
    assert len(seen) == 1  # waited for, or ended: never sent to another box while this one prefills


def test_the_front_sends_again_a_request_held_on_a_box_found_lost(
        home_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A request held on a box that stops answering (link cut, frozen) is sent again once the front finds the box
    lost: nothing reached its client (its first byte had not come). It was a 500 from the front itself before."""
    r, seen, _, log = _front_asks(home_data, tmp_path, caplog, ["held", "ok"])
    assert r.status_code == 200, r.text
    assert "hello" in r.text and "data: [DONE]" in r.text and "error" not in r.text
    assert len(seen) == 2
    assert len([m for m in log if "action=resent_after_box_lost" in m]) == 1


@dataclass
class _Through:
    """A front (gateway) → the real vllm-router → a box (gateway with the fleet key, the SIMULATED engine)."""

    keys: Any  # the front's KeyStore
    box: Gw
    url: str


@contextmanager
def _front_through_router(make_gateway: Callable[..., Gw], tmp_path: Path, limits: Any = None) -> Iterator[_Through]:
    """The loopback fleet of one box through the real router, serving; everything stopped at the end, even on a
    failure."""
    from app.backend.fleet.front import front_server
    from app.backend.fleet.router import RouterSupervisor
    from app.backend.gateway.keys import KeyStore
    from app.backend.gateway.proxy import Limits
    from app.backend.gateway.server import GatewayConfig
    from tests.conftest import free_port

    state = tmp_path / "front"
    state.mkdir()
    cfg = fleetfile.new_fleet(state, router_port=free_port(), router_metrics_port=free_port())
    boxgw = make_gateway(decode_tok_s=200.0)  # a box: its gateway with the fleet key, the SIMULATED engine
    assert boxgw.sim is not None
    boxgw.keys.create("front", scope="fleet", key=cfg.fleet_key)
    fleetfile.store(state).write(fleetfile.with_box(cfg, fleetfile.Box("b1", boxgw.url)))
    router = RouterSupervisor(state, lambda: fleetfile.load(state))
    keys = KeyStore(state)
    front = front_server(GatewayConfig(host="127.0.0.1", port=0, limits=limits or Limits()), keys, state)
    try:
        router.start()
        front.start()
        assert front.wait_started(10), f"front did not start: {front.error}"
        yield _Through(keys, boxgw, f"http://127.0.0.1:{front.port}")
    finally:
        front.stop()
        keys.close()
        router.stop()


def _serving(sdk: Any) -> None:
    import openai

    from tests.polling import wait_for

    def serves() -> bool:
        try:
            return bool(sdk.chat.completions.create(model="deepseek-v4-flash", max_tokens=2,
                                                    messages=[{"role": "user", "content": "hi"}]).choices)
        except openai.APIError:
            return False

    wait_for(serves, 30, "the front serving through the router", 0.3)


def test_a_client_key_at_the_front_is_billed_what_the_engine_did_through_the_real_router(
        make_gateway: Callable[..., Gw], tmp_path: Path) -> None:
    """Front (gateway) → the real vllm-router → a box (gateway, fleet key) → the SIMULATED engine, on loopback: a
    stream hung up mid-answer, one closed at its finish_reason chunk, a non-streaming request hung up, a whole
    stream and a whole answer. The client's key at the front is billed the prompt and completion tokens the box
    billed the fleet key and the engine counted (docs/fleet.md "Usage at the front"); the router drops
    `continuous_usage_stats` and closes both its connections at a hang-up, so before, the front billed the last
    count it had seen (none at all for a non-streaming hang-up)."""
    import openai

    from tests.gateway.conftest import engine_counts, running_requests
    from tests.polling import wait_for

    with _front_through_router(make_gateway, tmp_path) as fl:
        keys, boxgw, url = fl.keys, fl.box, fl.url
        assert boxgw.sim is not None
        key = keys.create("client").key
        sdk = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
        msg = [{"role": "user", "content": "Say something about mixtures of experts."}]
        _serving(sdk)
        # the first answer's record written at the front (after its client had it) before the starting figures
        wait_for(lambda: _billed(keys, "client") == _billed(boxgw.keys, "front"), 10, "the first answer billed")
        billed0 = _billed(keys, "client")
        box0 = _billed(boxgw.keys, "front")
        eng0 = engine_counts(boxgw.sim)
        # a stream hung up mid-answer
        stream = sdk.chat.completions.create(model="deepseek-v4-flash", messages=msg, max_tokens=2000, stream=True,
                                             extra_body={"ignore_eos": True})
        it = iter(stream)
        for _ in range(20):
            next(it)
        stream.close()
        t = time.monotonic()
        wait_for(lambda: running_requests(boxgw.sim) == 0, 10, "the hung-up stream aborted at the engine")
        print(f"hang-up at the front: the box's engine free {1000 * (time.monotonic() - t):.0f} ms later")
        # a stream closed at its finish_reason chunk (it asked no usage: none reaches it)
        stream = sdk.chat.completions.create(model="deepseek-v4-flash", messages=msg, max_tokens=30, stream=True)
        for ch in stream:
            assert ch.usage is None
            if ch.choices and ch.choices[0].finish_reason:
                break
        stream.close()
        # a non-streaming request hung up while the engine generates
        gen0 = engine_counts(boxgw.sim)[1]
        hang_up(url, key, lambda: engine_counts(boxgw.sim)[1] >= gen0 + 40, max_tokens=3000, ignore_eos=True)
        wait_for(lambda: running_requests(boxgw.sim) == 0, 10, "the hung-up request aborted at the engine")
        # a whole stream (no usage asked: none on any chunk) and a whole answer (its usage)
        chunks = list(sdk.chat.completions.create(model="deepseek-v4-flash", messages=msg, max_tokens=12, stream=True))
        assert chunks and all(c.usage is None for c in chunks)
        whole = sdk.chat.completions.create(model="deepseek-v4-flash", messages=msg, max_tokens=7)
        assert whole.usage is not None and whole.usage.completion_tokens == 7
        eng = engine_counts(boxgw.sim)
        want = (eng[0] - eng0[0], eng[1] - eng0[1])
        assert want[1] > 40 + 20 + 12 + 7  # the hung-up ones generated something
        # the box bills the fleet key what its engine sent: every prompt, and of each of the 2 hang-ups the tokens
        # the engine wrote (those it counted after its client's EOF are never written, as with real vLLM: 0-3 there,
        # docs/gateway.md "Usage"); the front bills its client exactly what the box billed the front
        def box_billed() -> tuple[float, float]:
            return _sub(_billed(boxgw.keys, "front"), box0)

        wait_for(lambda: box_billed()[0] == want[0] and 0 <= want[1] - box_billed()[1] <= unsent(200.0, 2), 10,
                 f"the box billing the fleet key the engine's counts {want}")
        _settles(lambda: _sub(_billed(keys, "client"), billed0), box_billed(), "the front billed the client's key")


def test_the_hold_cap_at_a_front_ends_the_answer_on_its_box_and_bills_what_the_engine_did(
        make_gateway: Callable[..., Gw], tmp_path: Path) -> None:
    """A key over the front's hold cap while another waits: its answer is ended on its box (`/fleet/end`, the box's
    rest and counts read through the router) and ends with the 429 error event, the waiting key then served; the
    front bills its clients exactly what the box billed the fleet key (before, the front half-closed the router's
    connection, which drops what the box sent after: the held answer was billed short at the front)."""
    import openai

    from app.backend.gateway.proxy import Limits
    from tests.gateway.conftest import engine_counts, running_requests
    from tests.polling import wait_for

    with _front_through_router(make_gateway, tmp_path, Limits(engine_slots=1, max_hold_s=1.0)) as fl:
        assert fl.box.sim is not None
        greedy, polite = fl.keys.create("greedy").key, fl.keys.create("polite").key
        with openai.OpenAI(base_url=fl.url + "/v1", api_key=polite, max_retries=0, timeout=30) as p_sdk:
            _serving(p_sdk)
            wait_for(lambda: _billed(fl.keys, "polite") == _billed(fl.box.keys, "front"), 10, "the first answer billed")
            front0, box0, eng0 = _billed(fl.keys, "polite"), _billed(fl.box.keys, "front"), engine_counts(fl.box.sim)
            events: list[str] = []
            with httpx.stream("POST", fl.url + "/v1/chat/completions", timeout=30,
                              headers={"Authorization": f"Bearer {greedy}"},
                              json={"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "go on"}],
                                    "max_tokens": 2000, "ignore_eos": True, "stream": True}) as r:
                lines = r.iter_lines()
                events += [next(lines) for _ in range(3)]  # answering
                waiting = threading.Thread(target=lambda: p_sdk.chat.completions.create(
                    model="deepseek-v4-flash", messages=[{"role": "user", "content": "me too"}], max_tokens=5))
                waiting.start()  # waits in the front's queue for the one slot: the hold cap counts
                events += list(lines)
            waiting.join(30)
        data = [e for e in events if e.startswith("data: ")]
        assert data[-1] == "data: [DONE]" and "held the engine" in data[-2] and '"code":429' in data[-2].replace(" ", "")
        wait_for(lambda: running_requests(fl.box.sim) == 0, 10, "the box's engine done")
        eng = engine_counts(fl.box.sim)
        assert eng[1] - eng0[1] < 2000  # ended at the engine, not generated whole

        def front_total() -> tuple[float, float]:
            g, p = _billed(fl.keys, "greedy"), _sub(_billed(fl.keys, "polite"), front0)
            return g[0] + p[0], g[1] + p[1]

        box = _sub(_billed(fl.box.keys, "front"), box0)
        wait_for(lambda: (box := _sub(_billed(fl.box.keys, "front"), box0)) == front_total() and box[1] > 0, 10,
                 f"the front billing its clients what the box billed: front {front_total()}, box {box}")
        box = _sub(_billed(fl.box.keys, "front"), box0)
        assert box[0] == eng[0] - eng0[0] and 0 <= eng[1] - eng0[1] - box[1] <= unsent(200.0), (box, eng, eng0)


def _billed(keys: object, name: str) -> tuple[float, float]:
    from app.backend.gateway.keys import KeyStore

    assert isinstance(keys, KeyStore)
    u = next(i.usage for i in keys.infos() if i.name == name)
    return float(u.prompt_tokens), float(u.completion_tokens)


def _settles(got: Callable[[], tuple[float, float]], want: tuple[float, float], what: str) -> None:
    """`got()` reaches `want` (usage is written once a second); else fail with both (prompt, completion)."""
    from tests.polling import wait_for

    try:
        wait_for(lambda: got() == want, 10, what)
    except AssertionError:
        raise AssertionError(f"{what} {got()} (prompt, completion) tokens; wanted {want}") from None


def _sub(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] - b[0], a[1] - b[1]


def test_a_client_gone_before_its_first_byte_at_the_front_is_billed_the_prompt_its_box_sent(
        home_data: Path, tmp_path: Path) -> None:
    """The front's client hangs up while the front waits for its stream's first byte (a long prefill on the box): the
    front asks the box to end the request (`POST /fleet/end` with the request's id) and reads what the box then
    sends, the engine's first chunk with the prompt's count, before it lets the answer go. Before, it closed at once
    and billed nothing, while the box billed the prompt to the fleet key (its own drain read that chunk)."""
    from app.backend.fleet.source import FleetSource
    from app.backend.gateway.keys import KeyStore
    from app.backend.gateway.proxy import Limits
    from app.backend.gateway.server import GatewayConfig, GatewayServer
    from tests.polling import wait_for

    router = _RouterDouble(["prefill"])  # the router and, for /fleet/end, the box
    cfg = fleetfile.with_box(_fleet(tmp_path), fleetfile.Box("b1", router.url))
    fleet = FleetSource(lambda: cfg)

    class Front:  # the front's status: serving through the double; the fleet's client on the gateway's loop
        def status(self) -> EngineStatus:
            return EngineStatus(True, router.url, "deepseek-v4-flash", state="ready", slots=4)

        async def start(self) -> None:
            await fleet.start()

        async def stop(self) -> None:
            await fleet.stop()

    keys = KeyStore(home_data / ".moet-panel")
    server = GatewayServer(GatewayConfig(host="127.0.0.1", port=0, limits=Limits()), keys, Front())
    try:
        make_front(server, fleet, cfg.fleet_key)
        server.start()
        assert server.wait_started(10), f"gateway did not start: {server.error}"
        k = keys.create("client").key
        hang_up(f"http://127.0.0.1:{server.port}", k, router.prefilling.is_set, stream=True)
        wait_for(lambda: next(i.usage for i in keys.infos() if i.name == "client").requests == 1, 10, "the record")
        usage = next(i.usage for i in keys.infos() if i.name == "client")
        assert (usage.prompt_tokens, usage.completion_tokens) == (4000, 1)
        assert len(router.ended) == 1 and len(router.ended[0]) == 32  # the front's id of the request
        assert keys.activity(1)[0].status == 499
    finally:
        server.stop()
        keys.close()
        router.close()


def test_a_box_sends_its_front_every_count_and_ends_a_request_when_its_front_asks(
        make_gateway: Callable[..., Gw]) -> None:
    """A box's gateway, to its fleet key: the engine's counts on every chunk, though the router left only
    `include_usage` of the front's `stream_options`; `POST /fleet/end` with a request's id ends that request at the
    engine and the rest the engine wrote still goes out, its last counts equal to the engine's counters and to what
    the box billed; a request of that id still queued gets a 499 (a 4xx: the router would send a 5xx to another
    box) and never reaches the engine."""
    import threading

    from app.backend.gateway.proxy import Limits
    from tests.gateway.conftest import engine_counts, running_requests
    from tests.polling import wait_for

    gw = make_gateway(limits=Limits(engine_slots=1), decode_tok_s=100.0, max_num_seqs=1)
    assert gw.sim is not None
    key = gw.keys.create("front", scope="fleet", key="mpk-" + "d" * 43).key
    auth = {"Authorization": f"Bearer {key}"}
    body = {"model": "deepseek-v4-flash", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # as the router sends it
    eng0 = engine_counts(gw.sim)
    events: list[dict[str, object]] = []
    queued: list[httpx.Response] = []

    def stream() -> None:
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=30,
                          headers={**auth, "x-moet-request": "r1"}) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))

    th = threading.Thread(target=stream)
    th.start()
    wait_for(lambda: len(events) >= 10, 10, "the stream under way")
    assert all(isinstance(e.get("usage"), dict) for e in events)  # every chunk: the engine's counts so far
    th2 = threading.Thread(target=lambda: queued.append(httpx.post(
        gw.url + "/v1/chat/completions", json=body, headers={**auth, "x-moet-request": "r2"}, timeout=30)))
    th2.start()
    wait_for(lambda: len(gw.server.app.queue) == 1, 10, "the second request waiting for the engine's one slot")
    for rid in ("r2", "r1"):
        r = httpx.post(gw.url + "/fleet/end", headers={**auth, "x-moet-request": rid}, timeout=5)
        assert r.status_code == 200 and r.json() == {"ended": 1}
    th.join(10)
    th2.join(10)
    assert not th.is_alive() and not th2.is_alive()
    assert queued[0].status_code == 499 and "front" in queued[0].json()["error"]["message"]
    wait_for(lambda: running_requests(gw.sim) == 0, 5, "the engine done")
    eng = engine_counts(gw.sim)
    last = events[-1]["usage"]
    assert isinstance(last, dict)
    # the last counts the engine wrote: its prompt, and its tokens but those counted after the EOF (never written, as
    # real vLLM's: docs/gateway.md "Usage")
    assert last["prompt_tokens"] == eng[0] - eng0[0] and 0 <= eng[1] - eng0[1] - last["completion_tokens"] <= unsent(100.0)
    assert eng[1] - eng0[1] < 3000  # ended at the engine, not generated whole
    wait_for(lambda: len(gw.keys.activity(5)) == 2, 5, "both records")
    usage = next(i.usage for i in gw.keys.infos() if i.name == "front")
    assert (usage.prompt_tokens, usage.completion_tokens) == (last["prompt_tokens"], last["completion_tokens"])
    assert sorted(a.status for a in gw.keys.activity(5)) == [499, 499]
    other = httpx.post(gw.url + "/fleet/end", headers={**auth, "x-moet-request": "r9"}, timeout=5)
    assert other.json() == {"ended": 0}
    assert httpx.post(gw.url + "/fleet/end", headers={"x-moet-request": "r9"}, timeout=5).status_code == 401
