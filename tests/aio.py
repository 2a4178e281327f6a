"""One way for a test to run a coroutine: `asyncio.run` on a thread of its own. Playwright's sync API (the
session's browser fixture) keeps a loop running on the main thread once a browser test ran, and asyncio.run()
is refused there."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def run_async(main: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
    """`asyncio.run(main())` on a fresh thread; its result, or its exception raised here."""
    async def bounded() -> T:
        return await asyncio.wait_for(main(), timeout)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(bounded())).result(timeout=timeout + 5)
