"""Keeps serving through the faults that heal by themselves (issue 39), on real Docker with the SIMULATED engine:
Docker away while the engine is stopped, the port held by another process, a wish from another process after a
give-up, and a switch while an answer streams. Every wait polls with a deadline; every container is removed."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.backend.contracts import EngineState
from app.backend.engine.controller import ControllerOptions, EngineController
from app.backend.engine.runtime.client import own_http
from app.backend.engine.supervision.desired import DesiredStore
from app.backend.engine.runtime.base import RuntimeUnavailable
from app.backend.recipe.endpoint import socket_path
from tests.engine.conftest import TEST_LABEL, fail_profile, panel_containers
from tests.polling import wait_for

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SUP = dict(supervise=True, resync_s=0.5, restart_backoff_s=0.3, restart_max_tries=2)


class AwayRuntime:
    """The real DockerRuntime behind a switch: while `away`, every call fails as an unreachable daemon does (the
    chaos soak's cut socket proxy, in-process)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.kind = inner.kind
        self.away = False

    def describe(self) -> str:
        return self._inner.describe()

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._inner, name)
        if not callable(real):
            return real

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.away:
                raise RuntimeUnavailable("Docker daemon unreachable at unix:///cut-proxy.sock: connection refused")
            return real(*args, **kwargs)

        return call


@pytest.fixture
def make_flaky(docker_client, sim_settings):
    from app.backend.engine.runtime.docker import DockerRuntime

    made: list[EngineController] = []

    def make(**opts: Any) -> tuple[EngineController, AwayRuntime]:
        rt = AwayRuntime(DockerRuntime(docker_client))
        options = ControllerOptions(extra_env={"MOET_SIM_BOOT_S": "1"}, extra_labels=dict(TEST_LABEL), **opts)
        ctl = EngineController(sim_settings, rt, options=options)  # type: ignore[arg-type]
        made.append(ctl)
        return ctl, rt

    try:
        yield make
    finally:
        for ctl in made:
            ctl.close()
        for c in panel_containers(docker_client, sim_settings.recipe.id, running_only=False):
            c.remove(force=True)


def _ready(ctl: EngineController, profile: str = "quality") -> bool:
    s = ctl.snapshot()
    return s.state is EngineState.READY and s.profile_id == profile


def test_docker_away_while_the_engine_stops_is_retried_and_served_again(make_flaky, docker_client) -> None:
    """A daemon restart: Docker stops answering and the engine is stopped meanwhile. The supervisor keeps trying
    (never "gave up", whatever the cap) and brings the engine back as soon as Docker answers."""
    ctl, rt = make_flaky(**SUP)
    assert ctl.start("quality").wait(90) and _ready(ctl)
    sub = ctl.subscribe()
    old = ctl.snapshot().container_id
    rt.away = True
    docker_client.containers.get(old).stop(timeout=5)  # what the daemon's restart does to its containers
    wait_for(lambda: ctl.snapshot().restart_try >= 3, 60, "three retries while Docker is away (cap is 2)")
    snap = ctl.snapshot()
    assert snap.state is EngineState.FAILED and not snap.gave_up
    assert snap.diagnosis is not None and snap.diagnosis.reason == "docker_unreachable"
    rt.away = False
    wait_for(lambda: _ready(ctl) and ctl.snapshot().container_id != old, 90, "serving again once Docker answers")
    assert not any(e.after.gave_up for e in sub.drain())
    assert ctl.snapshot().desired == "serve:quality"


def test_docker_away_while_the_engine_serves_keeps_it_serving(make_flaky) -> None:
    """Docker unreachable (a cut socket) but the engine still answers: observed truth says it serves."""
    ctl, rt = make_flaky(**SUP)
    assert ctl.start("quality").wait(90) and _ready(ctl)
    cid = ctl.snapshot().container_id
    sub = ctl.subscribe()
    rt.away = True
    wait_for(lambda: "Docker is unreachable; the engine still answers" in ctl.snapshot().message, 20,
               "the panel notes Docker away")
    rt.away = False
    wait_for(lambda: ctl.snapshot().restart_try == 0 and _ready(ctl), 20, "still ready")
    assert ctl.snapshot().container_id == cid
    assert all(e.after.state is EngineState.READY for e in sub.drain())  # never shown failed meanwhile


def test_a_busy_port_is_retried_until_it_is_free(make_flaky, sim_settings) -> None:
    """The engine's address (its socket, issue 40) briefly held by another process: a healing cause, not
    "Preflight check failed"."""
    path = Path(socket_path(sim_settings.data_dir))
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.unlink(missing_ok=True)
    holder = socket.socket(socket.AF_UNIX)
    holder.bind(str(path))
    holder.listen()
    try:
        ctl, _ = make_flaky(**SUP)
        t = ctl.start("quality")
        assert t.wait(60) and t.ok is False
        wait_for(lambda: ctl.snapshot().restart_try >= 3, 60, "three retries while the port is held (cap is 2)")
        snap = ctl.snapshot()
        assert not snap.gave_up and snap.diagnosis is not None and snap.diagnosis.reason == "port_in_use"
    finally:
        holder.close()
        path.unlink(missing_ok=True)
    wait_for(lambda: _ready(ctl), 90, "serving once the port is free")


def test_a_wish_from_another_process_clears_the_give_up(make_controller, docker_client, sim_settings) -> None:
    """A give-up is cleared by a start from the CLI (another controller), and the panel supervises again; the
    restart it then makes is counted on disk, so a fresh CLI reports it too."""
    oom = fail_profile(sim_settings.recipe, "oom_at_load")
    panel = make_controller(profiles=[oom], **SUP)
    panel.start(oom.id).wait(90)
    wait_for(lambda: panel.snapshot().gave_up, 30, "the panel gives up on the non-healing failure")
    cli = make_controller(actor="CLI")
    assert cli.start("quality", who="cli").wait(90)
    wait_for(lambda: _ready(panel) and not panel.snapshot().gave_up, 30, "the panel follows the CLI's wish")
    (c,) = panel_containers(docker_client, sim_settings.recipe.id)
    c.kill()
    wait_for(lambda: _ready(panel) and panel.snapshot().container_id != c.id, 90, "the panel restarts the crash")
    assert panel.snapshot().restarts_total == 1
    fresh = make_controller(actor="CLI", reattach=False)
    assert fresh.snapshot().restarts_total == 1  # `engine status --json` agrees with the panel's /metrics
    assert DesiredStore(sim_settings.state_dir).read().key == "serve:quality"


class Streams:
    """An AnswerCounter for the test's own streaming client (the gateway and the Chat tab implement the same)."""

    def __init__(self) -> None:
        self.n = 0

    def answers_in_flight(self) -> int:
        return self.n


def test_a_switch_lets_a_streaming_answer_finish_whole(make_controller) -> None:
    ctl = make_controller()
    assert ctl.start("quality").wait(90) and _ready(ctl)
    assert ctl.switch("balanced").wait(90) and _ready(ctl, "balanced")  # both boots measured now
    counter = Streams()
    ctl.add_answer_counter(counter)
    snap = ctl.snapshot()
    lines: list[str] = []
    errors: list[BaseException] = []
    first, done = threading.Event(), threading.Event()

    def read() -> None:
        counter.n = 1
        try:
            body = {"model": snap.served_name, "messages": [{"role": "user", "content": "count"}], "max_tokens": 120,
                    "stream": True}
            client, root = own_http(snap.base_url, httpx.Timeout(60))  # over the engine's socket (issue 40)
            with client, client.stream("POST", f"{root}/v1/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        first.set()
        except BaseException as exc:  # the cut this test guards against
            errors.append(exc)
        finally:
            counter.n = 0
            done.set()

    threading.Thread(target=read, daemon=True).start()
    assert first.wait(30), "the stream started"
    sub = ctl.subscribe()
    t = ctl.switch("quality")
    assert done.wait(60)
    assert not errors, errors
    assert lines[-1] == "data: [DONE]" and '"finish_reason":"length"' in "".join(lines).replace(" ", "")
    assert t.wait(90) and t.ok and _ready(ctl)
    seen = [e.after for e in sub.drain()]
    drained = [s for s in seen if s.draining]
    assert drained and drained[0].drain_in_flight == 1 and drained[0].expected_back_s > 0  # Retry-After: quality's boot
    # marked draining from the drain's start until the stop began: no instant of a serving engine open to a new
    # request that the stop then cuts (docs/fleet.md "Faults")
    after = seen[seen.index(drained[0]):]
    stop_at = next(i for i, s in enumerate(after) if s.state is EngineState.STOPPING)
    assert all(s.draining for s in after[:stop_at]), [(s.state, s.draining) for s in after[:stop_at + 1]]
    # an answer that never ends: a Stop during the switch's drain cancels the switch and keeps its deadline (not a
    # second full grace); "Switch now" ends the wait
    counter.n = 1
    sw = ctl.switch("balanced")
    wait_for(lambda: ctl.snapshot().draining, 10, "the switch drains")
    deadline = ctl.snapshot().drain_deadline
    stop = ctl.stop()
    assert sw.wait(10) and sw.ok is False and "cancelled" in sw.message
    wait_for(lambda: stop.done or ctl.snapshot().draining, 10, "the stop drains")
    assert ctl.snapshot().draining and ctl.snapshot().drain_deadline == deadline
    ctl.switch_now()
    assert stop.wait(30) and stop.ok and ctl.snapshot().state is EngineState.STOPPED


def test_a_switch_from_another_process_is_not_an_outside_stop(make_controller, docker_client, sim_settings) -> None:
    """Found by the chaos soak: a CLI switch stops the old engine before it boots the new one; the supervising
    panel took that stop for an outside one and recorded "stopped", so the next crash was never restarted."""
    panel = make_controller(**SUP)
    assert panel.start("quality").wait(90) and _ready(panel)
    cli = make_controller(actor="CLI")
    assert cli.switch("balanced", who="cli").wait(120)
    wait_for(lambda: _ready(panel, "balanced"), 60, "the panel follows the CLI's switch")
    assert DesiredStore(sim_settings.state_dir).read().key == "serve:balanced"  # the CLI's wish stands
    (c,) = panel_containers(docker_client, sim_settings.recipe.id)
    c.kill()
    wait_for(lambda: _ready(panel, "balanced") and panel.snapshot().container_id != c.id, 90,
             "the panel restarts the crash on the profile the CLI chose")
