"""The engine fixtures (real Docker, the SIMULATED image) for the service tests."""

from tests.engine.conftest import docker_client, make_controller, recipe_file, sim_image, sim_settings  # noqa: F401
