"""Moved to `app.backend.contracts` (the types that cross package lines). This name stays only until the
branches in flight that still import it are merged; new code imports `app.backend.contracts`."""

from app.backend.contracts import LIVE_STATES as LIVE_STATES
from app.backend.contracts import Diagnosis as Diagnosis
from app.backend.contracts import EngineSnapshot as EngineSnapshot
from app.backend.contracts import EngineState as EngineState
from app.backend.contracts import LogLine as LogLine
