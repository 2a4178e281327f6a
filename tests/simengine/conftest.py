"""Fixtures for the SIMULATED engine tests: in-process servers that always stop, log capture."""

from __future__ import annotations

import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from app.backend.simengine import SimEngineConfig, SimEngineServer

PREFIX_RE = re.compile(
    r"^(?:\((?P<proc>[^) ]+) pid=(?P<pid>\d+)\) )?(?P<lvl>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<ts>\d\d-\d\d \d\d:\d\d:\d\d) \[(?P<src>[^\]:]+):(?P<srcline>\d+)\] (?P<msg>.*)$"
)
# the summary line's format (docs/simengine.md), as a reader outside the panel would match it
SUMMARY_RE = re.compile(
    r"^\[(?P<tag>[a-z0-9]+)\] tick (?P<tick>\d+): (?:FP4 )?(?P<cached>\d+)/(?P<slots>\d+) slots, covering "
    r"(?P<cov>\d+)/(?P<total>\d+) experts \((?P<cov_pct>[\d.]+)%\); hit-rate (?P<hit_tok>[\d.]+)% tokens / "
    r"(?P<hit_exp>[\d.]+)% experts; window \+(?P<win_p>\d+)/-(?P<win_e>\d+), cumulative \+(?P<cum_p>\d+)/-(?P<cum_e>\d+)$"
)
HIST_RE = re.compile(r"^\[(?P<tag>[a-z0-9]+)\] (?:FP4 )?experts per layer: (?P<pairs>(?:L\d+:\d+ ?)+)$")
TIER_RE = re.compile(r"^moe_w2 delta tier: (?P<slots>\d+) slots x (?P<mib>[\d.]+) MiB \((?P<gib>[\d.]+) GiB pool\)$")
STORE_RE = re.compile(r"^\[(?P<tag>[a-z0-9]+)\] pack store: (?P<reads>\d+) row reads, (?P<gib>[\d.]+) GiB total$")

CARD_ENV = {  # the card's profile 1 knobs + the panel's trace addition
    "VLLM_MOE_W2": "1",
    "VLLM_MOE_W2_DELTA_POLICY": "freq",
    "VLLM_MOE_W2_DELTA_GB": "7",
    "VLLM_MOE_W2_DELTA_TRACE": "1",
    "VLLM_MOE_W2_PLANES_CACHE": "/planescache",
    "VLLM_MOE_W2_STORE_DIR": "/store",
    "VLLM_MOE_W2_CKPT_ID": "8863d864b7c75cde7493abc5899bdfe9e6dd16f6dab445961416f6e407c842b8",
}


def messages(lines: list[str]) -> list[str]:
    """The message part of every vLLM-format line (prefix stripped)."""
    out = []
    for line in lines:
        m = PREFIX_RE.match(line)
        if m:
            out.append(m.group("msg"))
    return out


def summaries(lines: list[str]) -> list[re.Match[str]]:
    return [m for m in (SUMMARY_RE.match(msg) for msg in messages(lines)) if m]


def http_status(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def poll(predicate: Callable[[], Any], timeout: float, interval: float = 0.02) -> Any:
    """Poll until predicate() is truthy; return its value or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


@pytest.fixture
def make_sim() -> Iterator[Callable[..., SimEngineServer]]:
    """Factory: make_sim(start=True, ready=True, **config fields) -> a server; all are stopped at teardown."""
    servers: list[SimEngineServer] = []

    def factory(start: bool = True, ready: bool = True, **overrides: Any) -> SimEngineServer:
        env = dict(CARD_ENV)
        env.update(overrides.pop("env", {}))
        fields: dict[str, Any] = {"port": 0, "boot_s": 0.05, "decode_tok_s": 400.0, "seed": 1, "env": env}
        fields.update(overrides)
        lines: list[str] = []
        server = SimEngineServer(SimEngineConfig(**fields), log=lines.append)
        server.captured = lines  # type: ignore[attr-defined]
        servers.append(server)
        if start:
            server.start()
            if ready:
                assert server.wait_ready(10), f"sim did not become ready: {lines[-5:]}"
        return server

    try:
        yield factory
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def sim(make_sim: Callable[..., SimEngineServer]) -> SimEngineServer:
    return make_sim()


@pytest.fixture
def client(sim: SimEngineServer):
    import openai

    with openai.OpenAI(base_url=sim.base_url + "/v1", api_key="EMPTY", max_retries=0, timeout=30) as c:
        yield c


def free_port_local() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
