"""The chaos soak's Docker socket proxy (bench/chaos/docker_proxy.py): forwards requests and long streams
byte for byte, cuts ("Docker away"), restores and holds replies (a slow daemon)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chaos.docker_proxy import DockerProxy
from tests.polling import wait_for

docker = pytest.importorskip("docker")


@pytest.fixture
def proxy(docker_client) -> Iterator[DockerProxy]:
    home = Path.home() / f"moet-test-proxy-{os.getpid()}-{threading.get_ident() % 10000}"
    with DockerProxy(home / "docker.sock") as p:
        try:
            yield p
        finally:
            p.stop()
            shutil.rmtree(home, ignore_errors=True)


def client_of(proxy: DockerProxy, timeout: int = 10):
    return docker.DockerClient(base_url=proxy.url, timeout=timeout)


def test_forwards_requests_and_a_long_event_stream(proxy: DockerProxy, docker_client, sim_image) -> None:
    c = client_of(proxy)
    assert c.ping() is True
    assert c.version()["ApiVersion"] == docker_client.version()["ApiVersion"]
    label = f"moet-test-proxy={os.getpid()}"
    events = c.events(decode=True, filters={"type": "container", "label": [label]})
    seen: list[str] = []
    reader = threading.Thread(target=lambda: [seen.append(e.get("Action", "")) for e in events], daemon=True)
    reader.start()
    made = docker_client.containers.create(sim_image, labels={"moet-test-proxy": str(os.getpid())})
    try:
        wait_for(lambda: "create" in seen, 10, "the create event through the proxy's stream")
    finally:
        made.remove(force=True)
    wait_for(lambda: "destroy" in seen, 10, "the destroy event on the same stream")
    events.close()
    c.close()


def test_cut_refuses_and_drops_open_streams_and_restore_answers_again(proxy: DockerProxy) -> None:
    c = client_of(proxy, timeout=5)
    events = c.events(decode=True, filters={"type": "container", "label": ["moet-test-proxy=never"]})
    ended = threading.Event()

    def read() -> None:
        try:
            for _ in events:
                pass
        except Exception:  # a connection closed under docker-py's reader
            pass
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    wait_for(lambda: proxy.active() >= 1, 5, "the stream's connection")
    proxy.cut()
    assert not proxy.listening
    assert ended.wait(10), "an open event stream must end when Docker goes away"
    with pytest.raises((docker.errors.DockerException, OSError)):
        client_of(proxy, timeout=3).ping()
    proxy.restore()
    assert client_of(proxy).ping() is True


def test_delay_holds_the_reply_until_it_is_due(proxy: DockerProxy) -> None:
    c = client_of(proxy, timeout=30)
    c.ping()  # the connection is open before the delay, as in a running panel
    proxy.set_delay(3.0)
    done = threading.Event()
    threading.Thread(target=lambda: (c.ping(), done.set()), daemon=True).start()
    wait_for(lambda: proxy.held() >= 1, 5, "the daemon's reply held by the proxy")
    assert not done.is_set(), "the reply reached the client while the proxy still held it"
    assert done.wait(15), "the held reply was never delivered"
    wait_for(lambda: proxy.held() == 0, 5, "the proxy's count of held replies back to 0")  # it counts after writing
    proxy.set_delay(0)
    assert c.ping() is True


def test_a_hijacked_connection_passes_both_ways(proxy: DockerProxy, docker_client, sim_image) -> None:
    """`docker exec -i` upgrades the HTTP connection to a raw stream (a hijack): stdin in, stdout back, EOF passed on."""
    import socket as pysocket

    box = docker_client.containers.run(sim_image, entrypoint=["/usr/bin/python3.11", "-c", "import time; time.sleep(120)"],
                                       command=[], detach=True, labels={"moet-test-proxy": str(os.getpid())})
    try:
        c = client_of(proxy, timeout=30)
        code = "import sys; sys.stdout.write(sys.stdin.read().upper())"
        ex = c.api.exec_create(box.id, ["/usr/bin/python3.11", "-c", code], stdin=True, stdout=True, stderr=False)
        sock = c.api.exec_start(ex["Id"], socket=True)
        raw = getattr(sock, "_sock", sock)
        raw.sendall(b"through the proxy\n")
        raw.shutdown(pysocket.SHUT_WR)  # EOF for the program's stdin: the proxy must pass the half-close on
        raw.settimeout(20)
        got = b""
        while chunk := raw.recv(4096):
            got += chunk
        # multiplexed frames (8-byte headers) around the program's output
        assert b"THROUGH THE PROXY" in got
        raw.close()
        c.close()
    finally:
        box.remove(force=True)
