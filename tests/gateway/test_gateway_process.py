"""The panel's gateway is a process of its own (issue 31): fed the engine's status on stdin by the panel, never
outliving it, its switch remembered across panel restarts. Real processes, data dirs under a home-like path,
free ports."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from app.backend.contracts import EngineSnapshot, EngineState
from app.backend.engine.decider.events import EventBus
from app.backend.gateway.switch import GatewayService, GatewayState, load_desired, save_desired, DesiredGateway
from app.backend.gateway.server import GatewayConfig
from app.backend.simengine import SimEngineServer
from tests.conftest import ROOT, free_port
from tests.gateway.conftest import SERVED
from tests.polling import wait_for

MSG = {"model": SERVED, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def listener_pid(port: int) -> int | None:
    """The pid of the process listening on 127.0.0.1:`port` (psutil reads /proc: our own processes)."""
    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port:
            return c.pid
    return None


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class FakeEngine:
    """The controller's two hooks the gateway service uses: `snapshot()` and `on_change(cb)` (a real EventBus)."""

    def __init__(self, snap: EngineSnapshot):
        self.snap = snap
        self.bus = EventBus()

    def snapshot(self) -> EngineSnapshot:
        return self.snap

    def on_change(self, cb: Callable[..., None]) -> Callable[[], None]:
        return self.bus.subscribe_callback(cb, "test-gateway-listener")

    def become(self, **kw: object) -> None:
        before = self.snap
        self.snap = EngineSnapshot(**{"base_url": before.base_url, "served_name": before.served_name, **kw})  # type: ignore[arg-type]
        self.bus.publish("Test", before, self.snap)


@pytest.fixture
def service(home_data: Path, make_sim: Callable[..., SimEngineServer]) -> Iterator[tuple[GatewayService, FakeEngine]]:
    sim = make_sim()
    engine = FakeEngine(EngineSnapshot(state=EngineState.READY, base_url=sim.base_url, served_name=SERVED))
    svc = GatewayService(home_data / ".moet-panel", GatewayConfig(port=free_port()), engine.snapshot, sim.base_url,
                         subscribe=engine.on_change)
    try:
        yield svc, engine
    finally:
        svc.close()


def _status(url: str, key: str) -> int:
    return httpx.post(url + "/v1/chat/completions", json=MSG, headers={"Authorization": f"Bearer {key}"},
                      timeout=5).status_code


def test_the_panels_gateway_is_its_own_process_and_follows_the_engine_within_a_second(service) -> None:
    svc, engine = service
    key = svc.create_key("laptop").key
    snap = svc.start()
    assert snap.state is GatewayState.ON, snap.message
    port = svc.config.port
    assert snap.url == f"http://127.0.0.1:{port}"
    pid = listener_pid(port)
    assert pid is not None and pid != os.getpid() and pid == snap.pid  # not a thread of the panel
    assert psutil.Process(pid).ppid() == os.getpid()
    assert "--status-from-stdin" in psutil.Process(pid).cmdline()
    assert key not in " ".join(psutil.Process(pid).cmdline())  # nothing secret on its argv or environment
    assert not [v for v in psutil.Process(pid).environ().values() if "mpk-" in v]
    assert _status(snap.url, key) == 200

    for state, words in ((EngineState.STOPPING, "switching"), (EngineState.STOPPED, "stopped")):
        engine.become(state=state)  # one change event: pushed to the child's stdin
        t0 = time.monotonic()
        wait_for(lambda: _status(snap.url, key) == 503, 1.0, f"503 within 1 s of the engine {state.value}")
        r = httpx.get(snap.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=5)
        assert r.status_code == 503 and words in r.json()["error"]["message"], (time.monotonic() - t0, r.text)
        engine.become(state=EngineState.READY)
        wait_for(lambda: _status(snap.url, key) == 200, 1.0, "200 within 1 s of the engine ready again")

    # a key revoked from here (another process than the gateway) is refused within a second
    assert svc.revoke_key("laptop")
    wait_for(lambda: _status(snap.url, key) == 401, 1.0, "the revoked key refused within 1 s")

    assert svc.stop().state is GatewayState.OFF
    wait_for(lambda: not port_open(port), 5, "the port closed after the switch went off")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_child_that_cannot_start_or_dies_is_failed_with_its_own_reason(service) -> None:
    svc, _ = service
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        snap = svc.start(port=taken.getsockname()[1])
        assert snap.state is GatewayState.FAILED and "cannot listen on 127.0.0.1" in snap.message, snap.message
        assert "Traceback" not in snap.message
    finally:
        taken.close()
    assert load_desired(svc.state_dir).on is False  # a refused start is not remembered as on

    snap = svc.start()
    assert snap.state is GatewayState.ON, snap.message
    assert snap.pid is not None
    os.kill(snap.pid, signal.SIGKILL)
    failed = wait_for(lambda: (s := svc.snapshot()).state is GatewayState.FAILED and s, 5, "FAILED after the kill")
    assert "the gateway stopped" in failed.message and "signal 9" in failed.message, failed.message
    assert svc.start().state is GatewayState.ON  # the switch works again


def test_the_switch_is_remembered_and_restored_after_a_panel_restart(home_data: Path, make_sim) -> None:
    sim = make_sim()
    engine = FakeEngine(EngineSnapshot(state=EngineState.READY, base_url=sim.base_url, served_name=SERVED))
    state_dir = home_data / ".moet-panel"
    port = free_port()

    def panel() -> GatewayService:
        return GatewayService(state_dir, GatewayConfig(port=port), engine.snapshot, sim.base_url,
                              subscribe=engine.on_change)

    first = panel()
    try:
        assert first.start().state is GatewayState.ON
        assert load_desired(state_dir) == DesiredGateway(on=True, port=port)
    finally:
        first.close()  # the panel goes away (a restart): its child stops, the switch stays on
    wait_for(lambda: not port_open(port), 5, "the first panel's gateway gone")
    assert load_desired(state_dir).on

    second = panel()
    try:
        assert second.restore() is not None  # no click
        snap = wait_for(lambda: (s := second.snapshot()).state is GatewayState.ON and s, 30, "the gateway restored")
        assert snap.restored and "restored after the panel restarted" in snap.message
        assert listener_pid(port) == snap.pid
        from app.ui.gateway import status_html  # what the Access tab shows

        shown = status_html(second.view())
        assert 'data-restored="1"' in shown and "restored after the panel restarted" in shown
        assert f"pid {snap.pid}" in shown
        second.stop()  # a click: off is remembered
        assert load_desired(state_dir) == DesiredGateway(on=False, port=port)
    finally:
        second.close()
    third = panel()
    try:
        assert third.restore() is None and third.snapshot().state is GatewayState.OFF
    finally:
        third.close()


def _serve(data: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MOET_PANEL_")}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "app.cli.main", "serve", "--demo", "--data-dir", str(data),
                                 "--port", str(port)], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _gateway_child_of(proc: subprocess.Popen[bytes], gw_port: int) -> int:
    child = wait_for(lambda: proc.poll() is None and listener_pid(gw_port), 120, "the restored gateway listening",
                     interval=0.2)
    assert proc.poll() is None, "the panel exited"
    assert child != proc.pid and psutil.Process(child).ppid() == proc.pid  # the panel's child, not the panel
    return int(child)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow  # starts a panel or an engine (the quick tier leaves it to the full run)
def test_a_stopped_or_killed_panel_leaves_no_gateway_listening(home_data: Path) -> None:
    """`moet-panel serve --demo` with the switch left on: its gateway (restored at start, no click) runs in a
    child. SIGTERM of the panel stops it and keeps the switch on (the next start restores it again); kill -9 of
    the panel closes the child's stdin and the gateway's port closes: no orphan on the LAN."""
    gw_port = free_port()
    (home_data / ".moet-panel").mkdir(mode=0o700)
    save_desired(home_data / ".moet-panel", DesiredGateway(on=True, port=gw_port))
    procs: list[subprocess.Popen[bytes]] = []
    children: list[int] = []
    try:
        log = home_data.parent / "panel.log"
        procs.append(proc := _serve(home_data, free_port(), log))
        children.append(child := _gateway_child_of(proc, gw_port))
        # the banner printed: the panel's SIGTERM handler is in (before it, SIGTERM's default action ends the
        # panel, and the child goes by EOF as after a kill)
        wait_for(lambda: b"moet-panel is running" in log.read_bytes(), 120, "the panel's banner", interval=0.2)
        proc.send_signal(signal.SIGTERM)  # systemd's stop, a terminal's kill
        assert proc.wait(60) == 0
        assert not port_open(gw_port) and _gone(child)
        assert load_desired(home_data / ".moet-panel").on  # the panel closing is not a switch-off

        procs.append(proc := _serve(home_data, free_port(), log))  # restarted: restored again
        children.append(child := _gateway_child_of(proc, gw_port))
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        wait_for(lambda: not port_open(gw_port), 5, "the gateway's port closed after the panel's kill -9")
        wait_for(lambda: _gone(child), 15, "the gateway process gone")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        for pid in children:  # only the children these panels started
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_the_status_line_round_trips() -> None:
    from app.backend.gateway.engine_status import EngineStatus, PipeSource

    st = EngineStatus(False, "http://127.0.0.1:8000", SERVED, "the engine is stopped", "stopped")
    assert EngineStatus.from_line(st.to_line()) == st
    gone: list[bool] = []
    src = PipeSource(open(os.devnull, "rb"), lambda: gone.append(True))
    src.feed(b"not json\n")
    src.feed(json.dumps({"ready": "yes"}))
    assert src.updates == 0 and not src.status().ready
    src.feed(st.to_line())
    assert src.status() == st and src.updates == 1


def _ask(url: str, key: str, max_tokens: int) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json={**MSG, "max_tokens": max_tokens},
                      headers={"Authorization": f"Bearer {key}"}, timeout=60)


def test_the_owners_caps_reach_the_running_gateway_without_a_restart_and_are_remembered(
        service, home_data: Path, caplog: pytest.LogCaptureFixture) -> None:
    """docs/gateway.md#caps: the Access tab's caps apply to the next request of the running gateway process (its
    pid unchanged, an answer streaming meanwhile read whole), a key's own cap wins, bad values change nothing."""
    import logging
    import threading

    from app.backend.gateway.caps import CapsError
    from app.backend.gateway.proxy import Limits

    caplog.set_level(logging.INFO, logger="moet_panel")
    svc, _ = service
    key = svc.create_key("laptop").key
    own = svc.create_key("ci", max_tokens=300.0).key  # a page's number: 300.0 is 300
    snap = svc.start()
    assert snap.state is GatewayState.ON, snap.message
    assert (snap.max_tokens, snap.max_hold_s) == (Limits.max_tokens, Limits.max_hold_s)
    pid = snap.pid

    streamed: list[str] = []

    def long_stream() -> None:  # 2,000 tokens asked under the old cap, running while the cap drops to 100
        with httpx.stream("POST", snap.url + "/v1/chat/completions", timeout=60,
                          json={**MSG, "max_tokens": 2000, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}},
                          headers={"Authorization": f"Bearer {key}"}) as r:
            streamed.extend(r.iter_lines())

    reader = threading.Thread(target=long_stream)
    reader.start()
    wait_for(lambda: len(streamed) > 3, 30, "the long answer streaming")
    caps = svc.set_caps(100, 60)
    assert (caps.max_tokens, caps.max_hold_s) == (100, 60.0)
    assert reader.is_alive()  # the change came mid-answer
    refused = wait_for(lambda: (r := _ask(snap.url, key, 200)).status_code == 400 and r, 2.0,
                       "the new cap in force within 2 s")
    assert "cap of 100 tokens" in refused.json()["error"]["message"]
    assert _ask(snap.url, key, 100).status_code == 200
    assert _ask(snap.url, own, 250).status_code == 200  # the key's own cap wins over the gateway's
    assert svc.snapshot().pid == pid == listener_pid(svc.config.port)  # no restart
    reader.join(60)
    usage = [json.loads(ln[6:])["usage"] for ln in streamed if ln.startswith("data: {") and '"usage"' in ln][-1]
    assert usage["completion_tokens"] == 2000 and [ln for ln in streamed if ln][-1] == "data: [DONE]"  # went on
    lines = [r.getMessage() for r in caplog.records if "action=caps" in r.getMessage()]
    assert len(lines) == 1 and "who=panel" in lines[0] and "max_tokens=100" in lines[0], lines

    # a key's cap set from the page, and back to the gateway's
    assert svc.set_key_max_tokens("laptop", 150.0)
    wait_for(lambda: _ask(snap.url, key, 150).status_code == 200, 2.0, "the key's own cap within 2 s")
    assert svc.set_key_max_tokens("laptop", None)
    wait_for(lambda: _ask(snap.url, key, 150).status_code == 400, 2.0, "the gateway's cap again within 2 s")

    # bad values: a clear error, nothing changed
    for tokens, hold, words in ((0, None, "from 1 to"), (12.5, None, "whole number"), (10**9, None, "context"),
                                (float("nan"), None, "whole number"), (None, 5, "from 10 to")):
        with pytest.raises(CapsError, match=words):
            svc.set_caps(tokens, hold)
    assert (svc.snapshot().max_tokens, load_desired(svc.state_dir).max_tokens) == (100, 100)

    # remembered: a restarted panel's gateway starts with them (on its argv), and shows them before it starts
    svc.close()
    again = GatewayService(svc.state_dir, svc.config, service[1].snapshot, svc._source.status().base_url)
    try:
        assert (again.snapshot().max_tokens, again.snapshot().max_hold_s) == (100, 60.0)
        started = again.start()
        assert "--max-tokens" in (argv := psutil.Process(started.pid).cmdline())
        assert argv[argv.index("--max-tokens") + 1] == "100" and argv[argv.index("--max-hold-s") + 1] == "60.0"
        assert again.set_caps(None, None).max_tokens == Limits.max_tokens  # empty: the default again
        wait_for(lambda: _ask(started.url, key, 200).status_code == 200, 2.0, "the default cap again")
    finally:
        again.close()
