"""The panel's Gradio theme: calm neutrals, one accent, system fonts (no web-font downloads offline)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import gradio as gr

from app.backend.contracts import EngineState


def make_theme() -> gr.themes.Base:
    return gr.themes.Soft(
        primary_hue=gr.themes.colors.teal,
        secondary_hue=gr.themes.colors.slate,
        neutral_hue=gr.themes.colors.slate,
        # Font objects, not bare strings: Gradio 6.31 compares theme fonts by `.name`.
        font=[gr.themes.Font(n) for n in ("system-ui", "Segoe UI", "Roboto", "sans-serif")],
        font_mono=[gr.themes.Font(n) for n in ("ui-monospace", "SFMono-Regular", "Menlo", "monospace")],
    ).set(block_radius="10px")


# One palette for state and severity, dark enough for white text on it and for text on white (WCAG AA).
GOOD, BUSY, BAD, IDLE, INFO = "#166534", "#92400e", "#b91c1c", "#475569", "#1d4ed8"
STATE_COLOURS: Mapping[EngineState, str] = MappingProxyType({
    EngineState.READY: GOOD, EngineState.STARTING: BUSY, EngineState.PREFLIGHT: BUSY, EngineState.STOPPING: BUSY,
    EngineState.FAILED: BAD, EngineState.STALLED: BAD, EngineState.STOPPED: IDLE,
})
SEVERITY_COLOURS: Mapping[str, str] = MappingProxyType({"critical": BAD, "warning": BUSY, "info": INFO})
