"""The one classifier of engine log lines that more than one consumer reads (docs/engine.md, "Logs").

The FP4 pool sizing lines (docs/engine.md, "Engine facts") drive both the boot tracker (`engine/bootlog.py`: is the pool
loaded, what the badge says) and the pool telemetry (`telemetry/trace.py`: the pool panel). One parser
here means one pool-slot value everywhere. The panel's own probe requests in the engine's access log are
recognised here too (the Logs views hide them by default; the files keep every line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from app.backend.contracts import LogLine, PoolSizing

_TIER = re.compile(r"moe_w2 delta tier: (?P<slots>\d+) slots x (?P<mib>[\d.]+) MiB(?: \((?P<gib>[\d.]+) GiB pool\))?")
_AUTO = re.compile(
    r"moe_w2 delta tier AUTO: (?P<slots>\d+) slots x (?P<mib>[\d.]+) MiB(?: \((?P<gib>[\d.]+) GiB pool; "
    r"(?P<free>[\d.]+) GiB was free after KV, reserve (?P<reserve>[\d.]+) GiB\))?"
)
_AUTO_OFF = re.compile(
    r"moe_w2 delta tier AUTO: (?:(?P<free>[\d.]+) GiB free after KV < reserve (?P<reserve>[\d.]+) GiB -> )?"
    r".*pool disabled"
)
_DEFERRED = re.compile(r"moe_w2 delta tier: auto-sizing deferred(?: .*\(slot (?P<mib>[\d.]+) MiB, reserve "
                       r"(?P<reserve>[\d.]+) GiB\))?")


def _f(v: str | None) -> float | None:
    return float(v) if v is not None else None


def pool_sizing(msg: str) -> PoolSizing | None:
    """Parse a pool sizing line (the message part, prefix removed); None for any other line."""
    if "delta tier" not in msg:
        return None
    if m := _AUTO.search(msg):
        return PoolSizing(int(m["slots"]), float(m["mib"]), _f(m["gib"]), True, False, _f(m["free"]),
                              _f(m["reserve"]))
    if m := _AUTO_OFF.search(msg):
        return PoolSizing(0, None, 0.0, True, False, _f(m["free"]), _f(m["reserve"]))
    if m := _DEFERRED.search(msg):
        return PoolSizing(None, _f(m["mib"]), None, True, True, None, _f(m["reserve"]))
    if m := _TIER.search(msg):
        return PoolSizing(int(m["slots"]), float(m["mib"]), _f(m["gib"]))
    return None


# uvicorn access lines for the panel's own polling: GET /metrics, /health, /v1/models from a loopback address, or
# with no address at all: uvicorn prints none for a client on the engine's unix socket (docs/engine.md "Engine facts").
_PROBE = re.compile(r'(?:(?:127\.\d+\.\d+\.\d+|\[?::1\]?|localhost):\d+|INFO:\s*) - "GET /(?:metrics|health|v1/models)[/? "]')


def is_panel_probe(text: str) -> bool:
    return '"GET /' in text and bool(_PROBE.search(text))


StreamChoice = Literal["both", "stdout", "stderr"]


@dataclass(frozen=True)
class LogFilter:
    """What a log view keeps: one stream or both, lines containing `needle` (any case), and the panel's own
    probe requests only when asked. The Engine tab's tail, the Logs tab and the log download all use it."""

    stream: StreamChoice = "both"
    needle: str = ""
    probes: bool = False

    def apply(self, lines: Iterable[LogLine]) -> list[LogLine]:
        needle = self.needle.lower()
        return [ln for ln in lines
                if (self.stream == "both" or ln.stream == self.stream) and needle in ln.text.lower()
                and (self.probes or not is_panel_probe(ln.text))]


EVERY_LINE = LogFilter(probes=True)
