"""Keeps serving (issue 39), without Docker: failures classed per cause, the supervisor's memory on disk shared by
every process, the exit diagnosis from the log's tail, a click that never waits behind a Docker call, the
reconciler's heartbeat, and the Chat tab refusing a new answer while a stop/switch drains. Fake runtimes stand in
for Docker; every wait polls with a deadline."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from app.backend.chat.conversations import ChatError, ChatService
from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState
from app.backend.engine.controller import ControllerOptions, EngineController
from app.backend.engine.supervision.desired import DesiredStore
from app.backend.engine.supervision.history import SupervisionStore
from app.backend.engine.supervision.restartpolicy import ENVIRONMENT, PolicyConfig, Restart, decide, preflight_cause
from app.backend.engine.runtime.base import MANAGED_LABEL, PROFILE_LABEL, RECIPE_LABEL, Instance, RuntimeUnavailable
from app.backend.engine.supervision.plan import BringBack, GiveUpNow, RestartLater, Respect, plan
from app.backend.recipe import SIMULATED_RECIPE
from app.backend.config.settings import Settings
from tests.engine.conftest import free_port, sim_recipe
from tests.polling import wait_for


class FakeRuntime:
    """Just enough of a Runtime for the observer: a list of instances, their logs, and a switch that makes every
    Docker call block (a slow daemon) or fail (an unreachable one)."""

    kind = "docker"

    def __init__(self, instances: list[Instance] | None = None, log: list[str] | None = None) -> None:
        self.instances = list(instances or [])
        self.log = list(log or [])
        self.block = threading.Event()  # set: list() blocks until `release` is set
        self.release = threading.Event()
        self.blocked = threading.Event()  # a list() call is blocked now
        self.away = False

    def _gate(self) -> None:
        if self.away:
            raise RuntimeUnavailable("Docker daemon unreachable at unix:///fake.sock")
        if self.block.is_set():
            self.blocked.set()
            self.release.wait(30)

    def describe(self) -> str:
        return "fake Docker"

    def check(self) -> None:
        self._gate()

    def list(self, labels: dict[str, str], include_stopped: bool = True) -> list[Instance]:
        self._gate()
        return list(self.instances)

    def get(self, ident: str) -> Instance | None:
        return next((i for i in self.instances if ident in (i.id, i.name)), None)

    def read_logs(self, ident: str, *, max_lines: int = 50000) -> list[tuple[str, str]]:
        return [("stderr", t) for t in self.log[:max_lines]]  # from the beginning, bounded (as Docker's)

    def tail_logs(self, ident: str, lines: int) -> list[tuple[str, str]]:
        return [("stderr", t) for t in self.log[-lines:]]

    def events(self, labels: dict[str, str]) -> None:
        return None

    def pids(self, ident: str) -> set[int]:
        return set()

    def stop(self, ident: str, grace_s: float) -> Instance | None:
        self._gate()
        return None

    def remove(self, ident: str) -> None:
        self.instances = [i for i in self.instances if i.id != ident]


def _settings(tmp_path: Path) -> Settings:
    st = Settings(SIMULATED_RECIPE, sim_recipe(free_port()), tmp_path / "data", True)
    st.ensure_state_dir()
    return st


def _exited(recipe_id: str, code: int) -> Instance:
    return Instance("c" * 64, "moet-engine-test", "exited",
                    labels={MANAGED_LABEL: "1", RECIPE_LABEL: recipe_id, PROFILE_LABEL: "quality"},
                    exit_code=code, started_at="2026-12-04T10:00:00.000Z", finished_at="2026-12-04T20:00:00.000Z")


@pytest.fixture
def controllers():
    made: list[EngineController] = []
    yield made
    for c in made:
        c.close()


# -- per cause, not per stage --------------------------------------------------------------------
def test_a_failed_preflight_is_classed_by_its_cause() -> None:
    assert preflight_cause(["docker", "nvidia_runtime", "image"]) == "docker_unreachable"
    assert preflight_cause(["port"]) == "port_in_use"
    assert preflight_cause(["gpu_memory"]) == "gpu_not_released"
    assert preflight_cause(["image"]) == "preflight_failed"  # missing and nothing builds it: stays
    assert preflight_cause(["image"], image_building=True) == "image_building"
    for stays in (["artifact:model"], ["ckpt_pin"], ["ecc"], ["port", "ckpt_pin"]):
        assert preflight_cause(stays) == "preflight_failed", stays


def test_a_healing_cause_is_retried_past_the_cap_and_never_given_up() -> None:
    cfg = PolicyConfig(max_tries=3, window_s=900, backoff_s=5)
    many = [float(t) for t in range(10)]  # far past the cap
    for reason in ENVIRONMENT:
        v = decide(cfg, reason, many, 10.0, env_tries=25)
        assert isinstance(v, Restart) and v.delay_s <= 10.0, (reason, v)
    assert decide(cfg, "preflight_failed", [], 0.0).healing is False  # type: ignore[union-attr]
    assert decide(cfg, "cuda_oom_at_load", [], 0.0).healing is False  # type: ignore[union-attr]


def _failed(reason: str) -> EngineSnapshot:
    return EngineSnapshot(state=EngineState.FAILED, container_id="c1", diagnosis=Diagnosis(reason, reason, "", ""))


def test_the_supervisor_plan_is_a_function_of_snapshot_wish_and_history() -> None:
    cfg = PolicyConfig(max_tries=3)
    capped = [1.0, 2.0, 3.0]
    a = plan(_failed("docker_unreachable"), "quality", cfg, capped, 4, 4.0, stopped_by_reboot=False)
    assert isinstance(a, RestartLater) and not a.capped and "retried while" in a.message
    assert isinstance(plan(_failed("killed"), "quality", cfg, capped, 0, 4.0, stopped_by_reboot=False), GiveUpNow)
    assert isinstance(plan(_failed("preflight_failed"), "quality", cfg, [], 0, 0.0, stopped_by_reboot=False),
                      GiveUpNow)
    outside = EngineSnapshot(state=EngineState.STOPPED,
                             diagnosis=Diagnosis("stopped_outside_panel", "stopped outside", "", ""))
    assert isinstance(plan(outside, "quality", cfg, [], 0, 0.0, stopped_by_reboot=False), Respect)
    by_docker = EngineSnapshot(state=EngineState.FAILED, container_id="c1",
                               diagnosis=Diagnosis("docker_restarted", "stopped while Docker was away", "", ""))
    assert isinstance(plan(by_docker, "quality", cfg, capped, 0, 0.0, stopped_by_reboot=False), BringBack)


# -- the supervisor's memory, shared by every process ---------------------------------------------
def test_gave_up_is_cleared_by_a_wish_from_any_process_and_restarts_are_counted_on_disk(tmp_path: Path) -> None:
    wishes, panel = DesiredStore(tmp_path), SupervisionStore(tmp_path)
    d1 = wishes.write("serve", "quality", "panel")
    panel.restarted(time.time())
    panel.give_up(d1, "killed", "gave up after 3 tries in 15 min")
    assert SupervisionStore(tmp_path).read().gave_up_on(wishes.read()) is not None  # another process sees it
    assert SupervisionStore(tmp_path).read().restarts_total == 1
    d2 = DesiredStore(tmp_path).write("serve", "quality", "CLI")  # `moet-panel engine start` in another process
    assert d2.since > d1.since or d2.since != d1.since
    s = panel.read()
    assert s.gave_up_on(wishes.read()) is None and s.recent(wishes.read()) == []  # the cap counts from the wish
    assert s.restarts_total == 1  # the counter is not reset: /metrics and `engine status --json` agree


def test_a_fresh_cli_controller_reports_the_panels_restarts_and_give_up(tmp_path: Path, controllers) -> None:
    st = _settings(tmp_path)
    d = DesiredStore(st.state_dir).write("serve", "quality", "panel")
    store = SupervisionStore(st.state_dir)
    store.restarted(time.time())
    store.restarted(time.time())
    store.give_up(d, "killed", "gave up after 2 tries in 15 min")
    cli = EngineController(st, FakeRuntime(), options=ControllerOptions(reattach=False, actor="CLI"))
    controllers.append(cli)
    snap = cli.snapshot()
    assert snap.restarts_total == 2 and snap.gave_up and snap.desired == "serve:quality"


# -- observation ---------------------------------------------------------------------------------
def test_exit_diagnosis_of_a_long_run_reads_the_logs_tail(tmp_path: Path, controllers) -> None:
    """A long-running engine's crash evidence is at the END of its log: a fresh panel must find it."""
    st = _settings(tmp_path)
    log = [f"INFO 12-04 10:{i // 60 % 60:02d}:{i % 60:02d} [loggers.py:123] Engine 000: throughput {i}"
           for i in range(30000)]
    log += ["ERROR 12-04 20:00:00 [core.py:900] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
            "2.00 GiB. GPU 0 has a total capacity of 95.00 GiB"]
    rt = FakeRuntime([_exited(st.recipe.id, 1)], log)
    ctl = EngineController(st, rt, options=ControllerOptions(resync_s=0.2))
    controllers.append(ctl)
    wait_for(lambda: ctl.snapshot().state is EngineState.FAILED, 10, "the exit explained")
    d = ctl.snapshot().diagnosis
    assert d is not None and d.reason == "cuda_oom_at_load", d
    assert any("CUDA out of memory" in e for e in d.evidence)


def test_a_click_never_waits_behind_a_docker_call(tmp_path: Path, controllers) -> None:
    st = _settings(tmp_path)
    rt = FakeRuntime()
    ctl = EngineController(st, rt, options=ControllerOptions(resync_s=0.2))
    controllers.append(ctl)
    rt.block.set()  # Docker now answers nothing: the observer's next list() hangs
    try:
        wait_for(rt.blocked.is_set, 10, "the observer blocked in a Docker call")
        answered: list[object] = []
        clicker = threading.Thread(target=lambda: answered.append(ctl.stop(who="user:alice")), daemon=True)
        clicker.start()
        clicker.join(8)  # a deadline far beyond what the reconciler needs: it makes no I/O
        assert answered, "stop() waited behind the blocked Docker call"
        assert not rt.release.is_set()  # and Docker was still blocked when it answered
        assert DesiredStore(st.state_dir).read().key == "stopped"  # the wish is recorded at once
    finally:
        rt.release.set()


def test_the_reconciler_turns_while_idle(tmp_path: Path, controllers) -> None:
    ctl = EngineController(_settings(tmp_path), FakeRuntime(), options=ControllerOptions(reattach=False))
    controllers.append(ctl)
    first = ctl.heartbeat()
    wait_for(lambda: ctl.heartbeat() > first, 10, "a second turn of the idle reconciler")
    ctl.close()
    last = ctl.heartbeat()
    assert last >= first


# -- drain: the Chat tab ---------------------------------------------------------------------------
def test_chat_refuses_to_start_an_answer_while_the_engine_drains(tmp_path: Path) -> None:
    st = _settings(tmp_path)
    draining = EngineSnapshot(state=EngineState.READY, profile_id="quality", base_url="http://127.0.0.1:9",
                              served_name="m", draining=True, drain_in_flight=2, drain_deadline=time.time() + 40)
    chat = ChatService(st.recipe, st.state_dir, snapshot_fn=lambda: draining)
    try:
        conv = chat.new_conversation()
        with pytest.raises(ChatError, match=r"waiting for 2 answer\(s\) to finish"):
            chat.send(conv.id, "hello", chat.default_sampling())
        assert chat.answers_in_flight() == 0
        assert [m.content for m in chat.get(conv.id).messages] == []  # nothing lost, nothing half-sent
    finally:
        chat.close()


# -- the operator's log ----------------------------------------------------------------------------
def test_decisions_and_caught_errors_reach_the_log_once(tmp_path: Path, controllers, caplog) -> None:
    """Docker away: every 0.1 s pass fails the same way and the log says so ONCE; it says when Docker is back;
    a person's stop is logged with who asked."""
    caplog.set_level("INFO", logger="moet_panel")
    st = _settings(tmp_path)
    rt = FakeRuntime()
    rt.away = True
    ctl = EngineController(st, rt, options=ControllerOptions(resync_s=0.1))
    controllers.append(ctl)
    passes = threading.Semaphore(0)
    real_list = rt.list

    def counted(labels: dict[str, str], include_stopped: bool = True) -> list[Instance]:
        passes.release()
        return real_list(labels, include_stopped)

    rt.list = counted  # type: ignore[method-assign]
    for _ in range(5):  # five failing passes of the observer
        assert passes.acquire(timeout=10)
    away = [r.getMessage() for r in caplog.records if 'context="reading Docker"' in r.getMessage()]
    assert len(away) == 1 and "RuntimeUnavailable" in away[0], away
    rt.away = False
    wait_for(lambda: any("action=docker_back" in r.getMessage() for r in caplog.records), 10, "Docker back logged")
    assert ctl.stop(who="user:alice").wait(10)
    stops = [r.getMessage() for r in caplog.records if "action=stop" in r.getMessage()]
    assert stops and "who=user:alice" in stops[0] and "component=engine" in stops[0]


def test_the_drain_grace_comes_from_the_service_setting_else_the_recipe(tmp_path: Path, controllers) -> None:
    from app.backend.service.config import ServiceConfig, ServiceConfigStore

    st = _settings(tmp_path)
    store = ServiceConfigStore(st.state_dir)
    store.write(ServiceConfig("never", (), 12.0))
    ctl = EngineController(st, FakeRuntime(), options=ControllerOptions(
        reattach=False, drain_grace_fn=lambda: store.read().drain_grace_s))
    controllers.append(ctl)
    assert ctl.drain_grace_s() == 12.0
    store.write(ServiceConfig("on-failure", (), None))
    assert ctl.drain_grace_s() == st.recipe.engine.drain_grace_s == 60.0


def test_an_image_build_in_progress_is_seen_by_every_process(tmp_path: Path) -> None:
    """`moet-panel engine build-image` holds the build mark: "image missing" then heals (retried, not given up)."""
    from app.backend.engine.builds.image import build_mark, image_build_running

    assert not image_build_running(tmp_path)
    mark = build_mark(tmp_path, "vllm-moet-sm120:v026")
    try:
        assert image_build_running(tmp_path)
        assert preflight_cause(["image"], image_building=image_build_running(tmp_path)) == "image_building"
    finally:
        mark.release()
    assert not image_build_running(tmp_path)


def test_the_engine_tab_says_what_a_drain_waits_for() -> None:
    from app.ui.engine import drain_line

    snap = EngineSnapshot(state=EngineState.READY, draining=True, drain_in_flight=3, drain_deadline=time.time() + 45)
    assert drain_line(snap) in ("waiting for 3 answers to finish (up to 45 s)",
                                "waiting for 3 answers to finish (up to 44 s)")
    assert drain_line(EngineSnapshot(state=EngineState.READY)) == ""


def test_an_operation_that_ends_makes_the_observer_read_docker_at_once(tmp_path: Path, controllers) -> None:
    """The end of an operation kicks the observer (this process's belief no longer wins): Docker is re-read at once,
    not at the next resync (60 s here)."""
    rt = FakeRuntime()
    observer_reads = threading.Semaphore(0)
    real_list = rt.list

    def counted(labels: dict[str, str], include_stopped: bool = True) -> list[Instance]:
        if threading.current_thread().name == "engine-observer":
            observer_reads.release()
        return real_list(labels, include_stopped)

    rt.list = counted  # type: ignore[method-assign]
    ctl = EngineController(_settings(tmp_path), rt, options=ControllerOptions(resync_s=60))
    controllers.append(ctl)
    assert observer_reads.acquire(timeout=10)  # the constructor's read
    assert ctl.stop().wait(10)
    assert observer_reads.acquire(timeout=10), "the observer was not kicked when the stop ended"


def test_the_pool_gate_reads_the_engines_own_log_before_calling_a_pool_missing() -> None:
    """Found by the chaos soak on a loaded box: the log follower lagged past the 5 s grace, and a good engine was
    stopped as "pool not loaded" (a non-healing class: the panel gave up). The container's own log decides."""
    from app.backend.engine.control.boot import _tail_shows_pool
    from app.backend.engine.runtime.base import RuntimeUnavailable

    class Tail:
        def __init__(self, lines: list[str], away: bool = False) -> None:
            self.lines, self.away = lines, away

        def tail_logs(self, ident: str, lines: int) -> list[tuple[str, str]]:
            if self.away:
                raise RuntimeUnavailable("Docker daemon unreachable")
            return [("stdout", t) for t in self.lines]

    sized = ("INFO 12-04 22:50:01 [moe_w2_delta.py:428] moe_w2 delta tier: 597 slots x 12.0 MiB (7.0 GiB pool)")
    off = "INFO 12-04 22:50:01 [moe_w2_delta.py:428] moe_w2 delta tier: 0 slots x 12.0 MiB (0.0 GiB pool)"
    assert _tail_shows_pool(Tail(["INFO starting", sized]), "c1")  # type: ignore[arg-type]
    assert not _tail_shows_pool(Tail(["INFO starting", off]), "c1")  # type: ignore[arg-type]  # a real 0: not a lag
    assert not _tail_shows_pool(Tail(["INFO starting"]), "c1")  # type: ignore[arg-type]
    assert not _tail_shows_pool(Tail([], away=True), "c1")  # type: ignore[arg-type]  # said once, not raised
