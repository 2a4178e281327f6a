"""The recipe's one-GPU engine as a template, one per GPU (issue 43): each GPU's `docker run` differs only in what
must (device, name, socket or port, label); gpu=None is the recipe's engine exactly as before."""

from __future__ import annotations

from app.backend.recipe import DEFAULT_RECIPE, load_recipe
from app.backend.recipe.command import GPU_LABEL, build_run_spec, config_hash
from app.backend.recipe.endpoint import engine_endpoint


def test_each_gpu_gets_its_device_name_socket_and_label() -> None:
    card = load_recipe(DEFAULT_RECIPE)
    data = "/srv/moet"
    before = build_run_spec(card, "quality", data)
    g0, g1 = build_run_spec(card, "quality", data, gpu=0), build_run_spec(card, "quality", data, gpu=1)
    assert before.gpus == g0.gpus == '"device=0"' and g1.gpus == '"device=1"'
    assert before.name == g0.name and g1.name == before.name + "-gpu1"
    assert GPU_LABEL not in before.labels_dict and g0.labels_dict[GPU_LABEL] == "0" and g1.labels_dict[GPU_LABEL] == "1"
    assert config_hash(before) == config_hash(g0)  # GPU 0's engine is the one engine: no drift is reported
    sock0, sock1 = engine_endpoint(card, data, 0).uds, engine_endpoint(card, data, 1).uds
    assert sock0 == engine_endpoint(card, data).uds and sock1.endswith("/gpu1.sock") and sock1 != sock0
    assert f"--uds {sock1}" in " ".join(g1.argv()) and f"--uds {sock0}" in " ".join(g0.argv())


def test_a_tcp_engine_of_gpu_n_listens_on_port_plus_n() -> None:
    card = load_recipe(DEFAULT_RECIPE)
    tcp = card.model_copy(update={"serve": card.serve.model_copy(update={"listen": "tcp"})})
    spec = build_run_spec(tcp, "quality", "/srv/moet", gpu=2)
    argv = spec.argv()
    assert argv[argv.index("--port") + 1] == str(card.serve.port + 2)
    assert engine_endpoint(tcp, "/srv/moet", 2).port == card.serve.port + 2
