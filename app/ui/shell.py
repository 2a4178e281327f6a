"""What every tab receives besides `AppState`: the page-wide pieces (`Shell`) and the event options the
tabs share. Tabs import this module, never app.ui.app (which imports the tabs)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypedDict

import gradio as gr


@dataclass
class Shell:
    """Page-wide pieces shared by tabs."""

    timer: gr.Timer  # 1 s page timer; tick handlers only read backend caches
    tabs: gr.Tabs | None = None  # set once the Tabs exist (the header is built above them)


class QuickEvent(TypedDict):
    show_progress: Literal["hidden"]
    concurrency_limit: None


# Handlers that only read backend caches or hand work to a backend thread: no spinner, no queue slot limit.
QUICK: QuickEvent = {"show_progress": "hidden", "concurrency_limit": None}
