"""A click on Stop answers while the observer is blocked on a slow Docker (issue 39: "a click never waits behind
a Docker call"). The Docker socket proxy holds every reply 10 s; Stop must hand back its ticket while a reply
to the controller is still held, i.e. without waiting for Docker. bench/chaos/click_latency.py prints the ms."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench.chaos.click_latency import slow_docker_rig, wait_held


@pytest.mark.slow
def test_stop_answers_while_a_docker_reply_is_held(docker_client, sim_image) -> None:
    home = Path.home() / f"moet-test-click-{os.getpid()}"
    with slow_docker_rig(home) as rig:
        rig.proxy.set_delay(10.0)
        assert wait_held(rig.proxy), "the controller made no Docker call within 15 s (resync every 0.5 s)"
        before = rig.proxy.delivered_total
        t0 = time.monotonic()
        ticket = rig.ctl.stop()  # type: ignore[attr-defined]
        took = time.monotonic() - t0  # for the message only: the assertion is on the order of events
        # no Docker reply reached the panel while stop() ran: it did not wait behind the blocked call
        assert rig.proxy.delivered_total == before, (
            f"Stop waited for a Docker reply held 10 s by the proxy (it answered after {took:.1f} s)")
        assert rig.proxy.held() >= 1
        assert ticket.accepted, ticket.message
        rig.proxy.set_delay(0)
        assert ticket.wait(60), "the stop never finished once Docker answered promptly again"
