"""Build the Gradio Blocks app: header strip + one tab per capability.

Each tab module in TABS exposes:
    TITLE: str                                  # tab label
    def render(state: AppState, shell: Shell) -> None   # called inside `with gr.Tab(TITLE)`
Tab modules only call backend services on `state`; they never talk to Docker/NVML/HTTP directly.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from app.backend.state import AppState

CSS_PATH = Path(__file__).resolve().parents[2] / "assets" / "css" / "panel.css"

# Tab modules in display order. A module is listed only once its capability has landed.
TABS = [
    "app.ui.profiles",
]


@dataclass
class Shell:
    """Page-wide pieces shared by tabs."""

    timer: gr.Timer  # 1 s page timer; tick handlers only read backend caches
    tabs: gr.Tabs


def build_ui(state: AppState) -> gr.Blocks:
    with gr.Blocks(title="moet-panel") as demo:
        timer = gr.Timer(1.0)
        try:
            header = importlib.import_module("app.ui.header")
        except ModuleNotFoundError:
            header = None
        with gr.Tabs(elem_id="main-tabs") as tabs:
            shell = Shell(timer=timer, tabs=tabs)
            if header is not None:
                pass
            for name in TABS:
                module = importlib.import_module(name)
                with gr.Tab(module.TITLE, id=name.rsplit(".", 1)[-1], elem_id=f"tab-{name.rsplit('.', 1)[-1]}"):
                    module.render(state, shell)
    return demo


def css_text() -> str:
    return CSS_PATH.read_text() if CSS_PATH.exists() else ""
