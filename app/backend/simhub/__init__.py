"""SIMULATED Hugging Face Hub: a local server with fault injection, real chunked artifacts, demo mode."""

from app.backend.simhub.faults import Fault, FaultBook
from app.backend.simhub.server import SimHub

__all__ = ["Fault", "FaultBook", "SimHub"]
