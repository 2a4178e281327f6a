"""The web server's own tick once a second, not ten times (issue 49; docs/ui-and-safety.md, "Idle cost").

uvicorn 0.54's `Server.main_loop` wakes every 0.1 s to do, once a second, its only periodic work (the `Date`
header) and, each time, to see whether it should exit: 10 wake-ups a second of the panel's event loop with no
page open, ~0.1 % of a core on the shared 2-core box. Gradio builds and runs the server (`gradio.http_server.
Server`, a subclass of uvicorn's) and has no setting for it, so `install()` (before `launch`) replaces, on
Gradio's subclass only, the loop by one that does the same work once a second and is woken at once by
`close()`: stopping the panel is as quick as before. The `Date` header keeps its one-second resolution.
Another uvicorn version keeps its own loop (tests/ui/test_servertick.py fails on an upgrade, so that the
copy is looked at again).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

COPIED_FROM = "0.54."  # the uvicorn version whose Server.main_loop / on_tick the loop below follows
TICK_S = 1.0  # uvicorn's once-a-second work (its Date header); an exit is seen at once (close() wakes the loop)


def install() -> bool:
    """Patch Gradio's Server class (idempotent); False, leaving uvicorn's loop, under another uvicorn version."""
    import uvicorn
    from gradio import http_server

    server = http_server.Server
    if not uvicorn.__version__.startswith(COPIED_FROM):
        return False
    if getattr(server, "_moet_tick", False):
        return True
    gradio_close = server.close

    async def main_loop(self: Any) -> None:
        self._moet_loop, self._moet_wake = asyncio.get_running_loop(), asyncio.Event()
        # counter 0: on_tick's once-a-second branch (the Date header) every tick, then its exit checks
        while not await self.on_tick(0):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moet_wake.wait(), TICK_S)

    def close(self: Any) -> None:
        self.should_exit = True
        loop, wake = getattr(self, "_moet_loop", None), getattr(self, "_moet_wake", None)
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already ended
                loop.call_soon_threadsafe(wake.set)
        gradio_close(self)

    server.main_loop = main_loop  # type: ignore[method-assign]
    server.close = close  # type: ignore[method-assign]
    server._moet_tick = True  # type: ignore[attr-defined]
    return True
