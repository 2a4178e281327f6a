"""SIMULATED vLLM-Moet engine: an OpenAI-compatible server that prints the real engine's log formats.

The test double and no-GPU demo of moet-panel. STDLIB ONLY, no imports from other app.* modules:
the package is copied alone into a FROM-scratch image (`python3 -m simengine`). `image.py` (host
side, docker-py) is the only exception and is imported explicitly, never from here.
"""

from .config import FAIL_MODES, SimEngineConfig, config_from_env_and_args
from .server import SimEngineServer, SimStats

__all__ = ["FAIL_MODES", "SimEngineConfig", "SimEngineServer", "SimStats", "config_from_env_and_args"]
