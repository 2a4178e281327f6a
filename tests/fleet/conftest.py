from tests.gateway.conftest import home_data, make_gateway  # noqa: F401 (fixtures of the gateway's tests)
from tests.simengine.conftest import make_sim  # noqa: F401
