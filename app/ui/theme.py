"""The panel's Gradio theme: calm neutrals, one accent, system fonts (no web-font downloads offline)."""

from __future__ import annotations

import gradio as gr


def make_theme() -> gr.themes.Base:
    return gr.themes.Soft(
        primary_hue=gr.themes.colors.teal,
        secondary_hue=gr.themes.colors.slate,
        neutral_hue=gr.themes.colors.slate,
        # Font objects, not bare strings: Gradio 6.31 compares theme fonts by `.name`.
        font=[gr.themes.Font(n) for n in ("system-ui", "Segoe UI", "Roboto", "sans-serif")],
        font_mono=[gr.themes.Font(n) for n in ("ui-monospace", "SFMono-Regular", "Menlo", "monospace")],
    ).set(block_radius="10px")
