"""Moved to `app.backend.contracts` (the types that cross package lines). This name stays only until the
branches in flight that still import it are merged; new code imports `app.backend.contracts`."""

from app.backend.contracts import GpuProcess as GpuProcess
from app.backend.contracts import GpuReader as GpuReader
from app.backend.contracts import GpuSample as GpuSample
from app.backend.contracts import ReaderStatus as ReaderStatus
