"""Logs tab: the running engine's live log, or any saved run; filter, stream (stdout/stderr), download.

Thin: lines come from `state.engine` (in-memory tail) and `state.engine.logs` (saved runs); downloads are
files the backend writes or already keeps.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from app.backend.engine.loglines import is_panel_probe
from app.backend.state import AppState

TITLE = "Logs"
LIVE = "live: current engine"
SHOW = 1000


def _sources(state: AppState) -> list[str]:
    return [LIVE] + state.engine.logs.runs()


# Follow live = pinned to the newest line until the user scrolls up (then left where they are, until they scroll
# back to the bottom). Runs in the browser on every change of the box.
FOLLOW_JS = """(follow) => {
  const ta = document.querySelector('#logs-text textarea');
  if (!ta) return;
  if (!ta.dataset.moetWatch) {
    ta.dataset.moetWatch = '1';
    ta.dataset.pinned = '1';
    ta.addEventListener('scroll', () => {
      ta.dataset.pinned = (ta.scrollHeight - ta.scrollTop - ta.clientHeight < 24) ? '1' : '0';
    });
  }
  if (follow && ta.dataset.pinned !== '0') { ta.scrollTop = ta.scrollHeight; }
}"""


def _lines(state: AppState, source: str, stream: str, needle: str, probes: bool = False) -> str:
    streams = ("stdout", "stderr") if stream == "both" else (stream,)
    if source == LIVE:
        lines = [ln for ln in state.engine.recent_logs(100000) if ln.stream in streams]
    else:
        lines = state.engine.logs.read_run(source, streams)
    needle = (needle or "").lower()
    keep = [ln for ln in lines if needle in ln.text.lower() and (probes or not is_panel_probe(ln.text))]
    tag = stream == "both"
    text = "\n".join((f"{ln.stream[3:]} | " if tag else "") + ln.text for ln in keep[-SHOW:])
    return text or "(no lines" + (f" matching {needle!r})" if needle else ")")


def _download(state: AppState, source: str, stream: str, needle: str) -> str | None:
    if source == LIVE:
        return str(state.engine.export_logs(stream, needle or ""))
    path = state.engine.logs.run_path(source, "stderr" if stream == "stderr" else "stdout")
    return str(path) if path else None


def render(state: AppState, shell: Any) -> None:
    if state.engine is None:
        gr.Markdown("Engine logs are not available in this build.")
        return
    gr.Markdown("Engine output, stdout and stderr kept apart. Saved runs live in the data dir "
                "(`.moet-panel/engine-logs/`, 20 MiB per file, last 10 runs).")
    with gr.Row():
        source = gr.Dropdown(_sources(state), value=LIVE, label="Run", elem_id="logs-source")
        stream = gr.Radio(["both", "stdout", "stderr"], value="both", label="Stream", elem_id="logs-stream")
        needle = gr.Textbox(label="Filter", placeholder="text to keep, e.g. ERROR or delta tier", elem_id="logs-filter")
    with gr.Row():
        refresh = gr.Button("Refresh run list", elem_id="logs-refresh")
        follow = gr.Checkbox(True, label="Follow live", elem_id="logs-follow")
        probes = gr.Checkbox(False, label="Show the panel's own probes (/metrics, /health, /v1/models)",
                             elem_id="logs-probes")
        download = gr.DownloadButton("Download", elem_id="logs-download")
    box = gr.Textbox(_lines(state, LIVE, "both", ""), lines=24, max_lines=24, label="Log", interactive=False,
                     autoscroll=True, elem_id="logs-text", elem_classes=["moet-code"])
    quick = {"show_progress": "hidden", "concurrency_limit": None}
    inputs = [source, stream, needle, probes]
    for ev in (source.change, stream.change, needle.submit, probes.change):
        ev(lambda s, st, n, pr: _lines(state, s, st, n, pr), inputs, [box], **quick)
    box.change(None, [follow], None, js=FOLLOW_JS)
    refresh.click(lambda: gr.Dropdown(choices=_sources(state)), None, [source], **quick)
    download.click(lambda s, st, n, _pr: _download(state, s, st, n), inputs, [download], **quick)

    def tick(s: str, st: str, n: str, pr: bool, on: bool):
        if not on or s != LIVE:
            return gr.skip()
        return _lines(state, s, st, n, pr)

    shell.timer.tick(tick, inputs + [follow], [box], show_progress="hidden", concurrency_limit=None,
                     trigger_mode="once")
