"""The multiprocessing context the artifact processes come from (procs.py): a forkserver that has imported
the download chain once, so a child starts in milliseconds (docs/downloads.md, "Three artifacts at once").

Its own module so that what crosses processes (budget.py, group.py) can build its primitives on it
without importing procs.py, which imports the artifact run."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import ForkServerContext

# imported once by the forkserver. Not the __main__ module (app.cli.main for the CLI and the panel):
# multiprocessing runs it again in each child, and runpy warns when it was imported before
PRELOAD = ["app.backend.download.job"]


def context() -> ForkServerContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx
