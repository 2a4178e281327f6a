"""The SIMULATED engine as a container on the real Docker engine (no registry)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from .conftest import free_port_local, http_status

docker = pytest.importorskip("docker")

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def docker_client() -> Iterator["docker.DockerClient"]:
    try:
        client = docker.from_env()
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any daemon problem means "no Docker here"
        pytest.skip(f"no usable Docker engine: {exc}")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def sim_container(docker_client) -> Iterator[tuple["docker.models.containers.Container", int]]:
    from app.backend.simengine.image import HASH_LABEL, IMAGE_TAG, ensure_image, source_digest

    assert ensure_image(docker_client) == IMAGE_TAG
    image = docker_client.images.get(IMAGE_TAG)
    assert image.labels["moet-panel.simulated"] == "1" and image.labels[HASH_LABEL] == source_digest()
    port = free_port_local()
    container = docker_client.containers.run(
        IMAGE_TAG, command=["--model", "/model", "--served-model-name", "deepseek-v4-flash", "--port", str(port),
                            "--max-model-len", "262144", "--gpu-memory-utilization", "0.97"],
        detach=True, network_mode="host", labels={"moet-panel.test": "1"},
        environment={"MOET_SIM_BOOT_S": "1", "VLLM_MOE_W2_DELTA_GB": "7", "VLLM_MOE_W2_DELTA_TRACE": "1"},
    )
    try:
        yield container, port
    finally:
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass


def _status(url: str) -> int:
    try:
        return http_status(url, timeout=1)
    except OSError:
        return 0


def test_container_boots_to_healthy_and_stops_cleanly(sim_container):
    container, port = sim_container
    url = f"http://127.0.0.1:{port}"
    seen: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen.append(_status(url + "/health"))
        if seen[-1] == 200:
            break
        container.reload()
        assert container.status in ("created", "running"), container.logs().decode()[-2000:]
        time.sleep(0.1)
    assert seen[-1] == 200, container.logs().decode()[-2000:]
    assert 503 in seen or 0 in seen  # it was seen loading first
    logs = container.logs().decode()
    assert "moe_w2 delta tier: 597 slots x 12.0 MiB (7.00 GiB pool)" in logs
    assert "SIMULATED" in logs
    container.stop(timeout=10)
    assert container.wait(timeout=20)["StatusCode"] == 0
