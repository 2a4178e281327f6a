"""Alerts reach a person (issue 32): through Apprise to a real local HTTP receiver (`json://`), one message
when an alert starts, one when it ends, none repeated; secrets never shown; sending never blocks."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from app.backend.contracts import Diagnosis, EngineSnapshot, EngineState
from app.backend.alerts.delivery import AlertTracker, engine_conditions
from app.backend.alerts.notify import Notifier, mask_url
from tests.engine.conftest import panel_containers
from tests.polling import wait_for


class Receiver:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.gate = threading.Event()
        self.gate.set()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                outer.gate.wait(30)
                n = int(self.headers.get("Content-Length", "0"))
                outer.bodies.append(json.loads(self.rfile.read(n)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *a) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"json://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def titles(self) -> list[str]:
        return [b.get("title", "") for b in self.bodies]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.gate.set()
        r.server.shutdown()
        r.server.server_close()


def test_secrets_in_urls_are_masked() -> None:
    shown = mask_url("json://alice:hunter2secret@example.org:8080/hook?token=abc123")
    assert "hunter2secret" not in shown and "abc123" not in shown and "example.org" in shown
    assert "tok" not in mask_url("tgram://123456789:ABCDEFsecrettokenXYZ/12345").lower().replace("tgram", "")
    assert "not a valid Apprise URL" in mask_url("bogus://x")


def test_tracker_sends_start_escalation_and_end_once_each() -> None:
    d = Diagnosis("killed", "killed (SIGKILL, exit 137)", "why", "fix")
    failing = EngineSnapshot(state=EngineState.FAILED, diagnosis=d, desired="serve:quality", restart_try=1,
                             message="killed (SIGKILL, exit 137) — restarting, try 1 of 3")
    t = AlertTracker()
    end = lambda c: "engine ready again on quality — resolved"  # noqa: E731
    assert [m[0] for m in t.update(engine_conditions(failing), end)] == [
        "engine killed (SIGKILL, exit 137) — restarting, try 1 of 3"]
    assert t.update(engine_conditions(failing), end) == []  # no repeat while it lasts
    try2 = EngineSnapshot(state=EngineState.STARTING, desired="serve:quality", restart_try=2, message="booting")
    assert t.update(engine_conditions(try2), end) == []
    gave_up = EngineSnapshot(state=EngineState.FAILED, diagnosis=d, desired="serve:quality", gave_up=True,
                             message="killed (SIGKILL, exit 137) — failed, gave up after 3 tries in 15 min")
    assert [m[0] for m in t.update(engine_conditions(gave_up), end)] == [
        "engine killed (SIGKILL, exit 137) — failed, gave up after 3 tries in 15 min"]
    ready = EngineSnapshot(state=EngineState.READY, profile_id="quality", desired="serve:quality")
    assert [m[0] for m in t.update(engine_conditions(ready), end)] == ["engine ready again on quality — resolved"]
    stopped = EngineSnapshot(state=EngineState.STOPPED, desired="stopped")
    assert t.update(engine_conditions(stopped), end) == []  # a person's stop is no alert


def test_sending_never_blocks_and_reaches_a_real_receiver(receiver: Receiver) -> None:
    receiver.gate.clear()  # the receiver hangs: the sender thread waits, the caller does not
    n = Notifier(lambda: (receiver.url,))
    try:
        done = threading.Event()
        threading.Thread(target=lambda: (n.send("first", "body"), n.send("second", ""), done.set()), daemon=True).start()
        assert done.wait(5)  # a deadline: a blocking send would still be waiting on the hung receiver
        receiver.gate.set()
        wait_for(lambda: receiver.titles() == ["first", "second"], 30, "both messages delivered in order")
        assert n.send_test().startswith("sent to json://127.0.0.1")
        assert receiver.titles()[-1] == "moet-panel: test notification"
    finally:
        n.close()


def test_engine_crash_and_recovery_are_told_once_each(make_controller, docker_client, sim_settings,
                                                      receiver: Receiver) -> None:
    from app.backend.alerts.delivery import AlertService

    ctl = make_controller(supervise=True, resync_s=0.5, restart_backoff_s=0.5)
    assert ctl.start("quality").wait(90)
    n = Notifier(lambda: (receiver.url,))
    svc = AlertService(n, engine=ctl, period_s=1.0)
    try:
        (c,) = panel_containers(docker_client, sim_settings.recipe.id)
        c.kill()
        wait_for(lambda: len(receiver.bodies) >= 2, 60, "the alert and its resolution")
        assert receiver.titles() == ["engine killed (SIGKILL, exit 137) — restarting, try 1 of 3",
                                     "engine ready again on quality — resolved"]
        assert "SIGKILL" in receiver.bodies[0]["message"]
        svc.evaluate()  # more passes while ready: nothing more is sent
        assert len(receiver.bodies) == 2
    finally:
        svc.close()
        n.close()


def test_no_message_before_the_supervisor_has_decided() -> None:
    from app.backend.alerts.delivery import decision_pending

    d = Diagnosis("killed", "killed (SIGKILL, exit 137)", "why", "fix")
    just_failed = EngineSnapshot(state=EngineState.FAILED, diagnosis=d, desired="serve:quality")
    assert decision_pending(just_failed)
    assert not decision_pending(EngineSnapshot(state=EngineState.FAILED, diagnosis=d, desired="serve:quality",
                                               restart_try=1))
    assert not decision_pending(EngineSnapshot(state=EngineState.FAILED, diagnosis=d, desired="serve:quality",
                                               restart_policy="never"))
    assert not decision_pending(EngineSnapshot(state=EngineState.FAILED, diagnosis=d, desired="stopped"))


def test_the_apprise_notify_type_reaches_the_receiver(receiver: Receiver) -> None:
    """issue 39 item 5: a crash is sent as `failure`, a resolution as `success` (every message was `info`)."""
    n = Notifier(lambda: (receiver.url,))
    try:
        n.send("engine killed", "SIGKILL", "failure")
        n.send("engine ready again — resolved", "", "success")
        wait_for(lambda: len(receiver.bodies) == 2, 30, "both messages delivered")
        assert [b["type"] for b in receiver.bodies] == ["failure", "success"]
    finally:
        n.close()


def test_service_json_is_private_and_its_urls_never_reach_a_page_or_log(tmp_path) -> None:
    """issue 40 item 7: service.json held Apprise passwords at 0644."""
    import os
    import stat

    from app.backend.service.config import ServiceConfig, ServiceConfigStore

    store = ServiceConfigStore(tmp_path)
    store.path.write_text("{}")
    os.chmod(store.path, 0o644)  # an older, looser file is replaced by a private one
    store.write(ServiceConfig(None, ("json://bob:Pa55wordXYZ@example.org/hook/TopSecretPath?token=QuerySecret1",)))
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    shown = mask_url(store.read().notify_urls[0])
    for secret in ("bob", "Pa55wordXYZ", "TopSecretPath", "QuerySecret1"):
        assert secret not in shown


def test_secrets_in_a_urls_path_and_user_are_masked_too() -> None:
    """issue 40 item 7: Apprise's privacy rendering kept the path (`json://host/hook/SecretPath`, an ntfy topic)
    and the user name."""
    assert mask_url("json://example.org/hook/SecretPath123") == "json://example.org/***/***"
    assert "my-private-topic" not in mask_url("ntfy://ntfy.sh/my-private-topic")
    assert "someone" not in mask_url("json://someone:pw@example.org/x")
