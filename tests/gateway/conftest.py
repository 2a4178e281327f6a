"""Fixtures for the API gateway tests: the SIMULATED engine in-process, a gateway on a free port in front of
it (standalone: it probes the engine, as `moet-panel gateway` does), keys in a data dir under a
home-like path, the real `openai` SDK. Everything started here is stopped at teardown, even on failure."""

from __future__ import annotations

import math
import re
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest

from app.backend.gateway.keys import KeyStore
from app.backend.gateway.proxy import Limits
from app.backend.gateway.engine_status import EngineStatus, EngineStatusSource, ProbeSource
from app.backend.gateway.server import GatewayConfig, GatewayServer
from app.backend.simengine import SimEngineServer
from tests.simengine.conftest import make_sim  # noqa: F401 (the one simulated-engine factory; a fixture)

SERVED = "deepseek-v4-flash"


def key_refused(c: openai.OpenAI) -> bool:
    """The gateway answers this client's key with 401 (revoked or expired)."""
    try:
        c.models.list()
        return False
    except openai.AuthenticationError:
        return True


def running_requests(sim: SimEngineServer) -> float:
    """`vllm:num_requests_running` from the engine's own /metrics."""
    text = urllib.request.urlopen(sim.base_url + "/metrics", timeout=5).read().decode()
    m = re.search(r"^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)
    assert m, "no vllm:num_requests_running in /metrics"
    return float(m.group(1))


def engine_counts(sim: SimEngineServer) -> tuple[float, float]:
    """The engine's own `vllm:prompt_tokens_total` and `vllm:generation_tokens_total` (what a key is billed)."""
    text = urllib.request.urlopen(sim.base_url + "/metrics", timeout=5).read().decode()
    out = []
    for name in ("vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? ([0-9.e+-]+)$", text, re.M)
        assert m, f"no {name} in /metrics"
        out.append(float(m.group(1)))
    return out[0], out[1]


def unsent(tok_s: float, hang_ups: int = 1) -> int:
    """The most completion tokens an engine may count after its client's EOF and never write (docs/gateway.md
    "Usage"): real vLLM 0-3; the SIMULATED engine the catch-up burst in hand, which a loaded box stretches — what it
    makes in 0.25 s, at least 4, a hang-up (seen: 6 at 200 tok/s in a loaded full run)."""
    return hang_ups * max(4, math.ceil(tok_s * 0.25))


class FixedSource:
    """An engine status set by the test (the panel's snapshot while switching, for instance)."""

    def __init__(self, status: EngineStatus):
        self.value = status

    def status(self) -> EngineStatus:
        return self.value

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


@dataclass
class Gw:
    server: GatewayServer
    keys: KeyStore
    sim: SimEngineServer | None
    data: Path
    created: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def key(self, name: str = "laptop", **kw: Any) -> str:
        k = self.keys.create(name, **kw).key
        self.created[name] = k
        return k

    def client(self, key: str, **kw: Any) -> Any:
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=kw.pop("timeout", 30), **kw)


@pytest.fixture
def home_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir under a home-like path (the user's world), not the temp dir's root."""
    home = tmp_path_factory.mktemp("home")
    d = home / ".local" / "share" / "moet-panel" / "data"
    d.mkdir(parents=True)
    return d


@pytest.fixture
def make_gateway(home_data: Path, make_sim: Callable[..., SimEngineServer]) -> Iterator[Callable[..., Gw]]:  # noqa: F811 (the imported fixture)
    started: list[Gw] = []

    def factory(limits: Limits | None = None, sim: SimEngineServer | None = None, source: EngineStatusSource | None = None,
                **sim_kw: Any) -> Gw:
        if sim is None and source is None:
            sim = make_sim(**sim_kw)
        keys = KeyStore(home_data / ".moet-panel")
        src = source or ProbeSource(sim.base_url if sim else "http://127.0.0.1:9", SERVED, interval_s=0.2)
        server = GatewayServer(GatewayConfig(host="127.0.0.1", port=0, limits=limits or Limits()), keys, src)
        gw = Gw(server, keys, sim, home_data)
        started.append(gw)
        server.start()
        assert server.wait_started(10), f"gateway did not start: {server.error}"
        return gw

    try:
        yield factory
    finally:
        for gw in started:
            gw.server.stop()
            gw.keys.close()
