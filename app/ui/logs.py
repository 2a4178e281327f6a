"""Logs tab: the running engine's live log, or any saved run; filter, stream (stdout/stderr), download.

Thin: lines come from `state.engine` (in-memory tail) and `state.engine.logs` (saved runs), filtered by
the backend's one `LogFilter`; downloads are files the backend writes or already keeps. The live tail is drawn
by the page feed as text (app/ui/logtail.py, issue 49), not by Gradio events.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import gradio as gr

from app.backend.engine.controller import EngineController
from app.backend.engine.logs.loglines import LogFilter, StreamChoice
from app.backend.web.exports import copy_export
from app.backend.state import AppState
from app.ui.logtail import STREAMS, LiveTail, TailStream, log_text, view_of
from app.ui.shell import QUICK, Shell

TITLE = "Logs"
LIVE = "live: current engine"
SHOW = 1000


def _sources(ctl: EngineController) -> list[str]:
    return [LIVE] + ctl.logs.runs()


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


def _lines(ctl: EngineController, source: str, view: LogFilter) -> str:
    if source == LIVE:
        return _shown(view)(LiveTail.of(ctl).text(view, SHOW))
    lines = ctl.logs.read_run(source, ("stdout", "stderr") if view.stream == "both" else (view.stream,))
    return _shown(view)(log_text(lines, view, SHOW))


def _shown(view: LogFilter) -> Callable[[str], str]:
    """What the box says for no line."""
    return lambda text: text or "(no lines" + (f" matching {view.needle!r})" if view.needle else ")")


def live_stream(ctl: EngineController, query: Mapping[str, str]) -> TailStream:
    """The box's part of the page's stream while the Logs tab is shown (issue 49: text, no Gradio event): the
    live tail as the page's view shows it, nothing for a saved run or with Follow live off (page-feed.js sends
    the Run, Stream, Filter, probes and Follow settings)."""
    view = view_of(query)
    live = query.get("source", LIVE) == LIVE and query.get("follow", "1") == "1"
    return TailStream(LiveTail.of(ctl) if live else None, "logs-text", view, SHOW, _shown(view))


def _download(ctl: EngineController, source: str, view: LogFilter) -> str | None:
    if source == LIVE:
        return str(ctl.export_logs(view))
    path = ctl.logs.run_path(source, "stderr" if view.stream == "stderr" else "stdout")
    # a copy in the exports folder: the one place the web server hands files from (app/backend/web/exports.py)
    return str(copy_export(ctl.settings.state_dir, path, path.name)) if path else None


def render(state: AppState, shell: Shell) -> None:
    ctl = state.engine
    if ctl is None:
        gr.Markdown("Engine logs are not available: this panel runs without an engine controller.")
        return
    gr.Markdown("Engine output, stdout and stderr kept apart. Saved runs live in the data dir "
                "(`.moet-panel/engine-logs/`, 20 MiB per file, last 10 runs).")
    with gr.Row():
        # min_width: on a 420 px window the run's name gets its own line instead of being cut off.
        source = gr.Dropdown(_sources(ctl), value=LIVE, label="Run", elem_id="logs-source", min_width=300)
        stream = gr.Radio(STREAMS, value="both", label="Stream", elem_id="logs-stream")
        needle = gr.Textbox(label="Filter", placeholder="text to keep, e.g. ERROR or delta tier", elem_id="logs-filter")
    with gr.Row():
        refresh = gr.Button("Refresh run list", elem_id="logs-refresh")
        follow = gr.Checkbox(True, label="Follow live", elem_id="logs-follow")
        probes = gr.Checkbox(False, label="Show the panel's own probes (/metrics, /health, /v1/models)",
                             elem_id="logs-probes")
        download = gr.DownloadButton("Download", elem_id="logs-download")
    box = gr.Textbox(_lines(ctl, LIVE, LogFilter()), lines=24, max_lines=24, label="Log", interactive=False,
                     autoscroll=True, elem_id="logs-text", elem_classes=["moet-code"])
    inputs = [source, stream, needle, probes]

    def show(src: str, st: StreamChoice, text: str | None, pr: bool) -> str:
        return _lines(ctl, src, LogFilter(st, text or "", pr))

    for ev in (source.change, stream.change, needle.submit, probes.change):
        ev(show, inputs, [box], **QUICK)
    box.change(None, [follow], None, js=FOLLOW_JS)
    def runs_now(current: str | None) -> Any:
        """The saved runs as they are now (a run that ended since the page was built, issue 29)."""
        choices = _sources(ctl)
        # a value only when the pick is gone: sent back always, it could undo a pick made meanwhile
        return gr.Dropdown(choices=choices) if current in choices else gr.Dropdown(choices=choices, value=LIVE)

    refresh.click(runs_now, [source], [source], **QUICK)
    shell.on_load(runs_now, [source], [source])
    shell.on_tab(TITLE, runs_now, [source], [source])
    download.click(lambda src, st, text, pr: _download(ctl, src, LogFilter(st, text or "", pr)), inputs, [download],
                   **QUICK)

    # the live tail: drawn by the page feed (text in the box, no Gradio event, issue 49); the view changes above
    # answer at once through Gradio, and the page opens a stream for the new view (assets/js/page-feed.js)
    shell.stream(lambda query: live_stream(ctl, query))
