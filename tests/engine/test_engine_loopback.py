"""A recipe whose engine listens on TCP (`listen = "tcp"`, an engine without --uds) listens on loopback only
(issue 31): the simulated engine container, started by the panel's own controller on real Docker with
`--network host`, opens no socket beyond 127.0.0.1. The default (a unix socket, issue 40): test_engine_socket.py."""

from __future__ import annotations

from app.backend.contracts import EngineState
from app.backend.simengine.image import ensure_image, source_digest
from app.backend.settings import Settings
from tests.engine.conftest import wait_until
from tests.gateway.sockets import container_listening, listening, non_loopback


def test_simulated_engine_container_listens_on_loopback_only(make_controller, docker_client, sim_settings) -> None:
    # this source's image, under a tag of its own: the shared tag may be rebuilt meanwhile from another checkout
    tag = ensure_image(docker_client, tag=f"moet-panel/sim-engine:src-{source_digest()}")
    recipe = sim_settings.recipe
    recipe = recipe.model_copy(update={"engine": recipe.engine.model_copy(update={"image": tag}),
                                       "serve": recipe.serve.model_copy(update={"listen": "tcp"})})
    settings = Settings(recipe_path=sim_settings.recipe_path, recipe=recipe, data_dir=sim_settings.data_dir, demo=True)
    ctl = make_controller(settings)
    spec = ctl.run_spec("quality")
    assert spec.args[-2:] == ("--host", "127.0.0.1") and spec.network == "host" and "--uds" not in spec.args
    report = ctl.preflight("quality")  # the preflight says what a TCP engine leaves open
    port_item = next(i for i in report.items if i.id == "port")
    assert port_item.status == "warn" and "web page" in port_item.detail
    ctl.start("quality")
    wait_until(lambda: ctl.snapshot().state is EngineState.READY, 60, "ready")
    container = docker_client.containers.get(ctl.snapshot().container_id)
    port = recipe.serve.port
    # every socket the container's processes listen on, read inside it
    own = container_listening(container)
    assert (("127.0.0.1", port)) in own, f"the engine's port {port} is not among its listening sockets: {own}"
    assert non_loopback(own) == [], f"the engine listens beyond loopback: {own}"
    # and the host's view (--network host: the box's namespace): nothing on the engine's port beyond loopback
    on_port = [s for s in listening(container.attrs["State"]["Pid"]) if s[1] == port]
    assert on_port and non_loopback(on_port) == [], on_port
    # and the panel's own probes still reach it on loopback
    assert ctl.snapshot().base_url.startswith("http://127.0.0.1:")
