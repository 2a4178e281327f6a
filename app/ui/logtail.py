"""The current engine's live log as a view shows it, drawn by the page feed (issue 49, docs/ui-and-safety.md,
"The page at its floor"): the Engine tab's and the Logs tab's live tails are text on the page's one stream,
set in their boxes by the page script, not Gradio events.

`LiveTail` keeps, per view (stream, filter, probes), the lines it shows and filters only the lines that arrived
since it last looked: the SIMULATED engine's probe lines move the log every second while it is ready, and
filtering the whole 2,000-line tail took ~3 ms on the shared 2-core box each time. One `LiveTail` per engine
controller serves every page; `TailStream` is one page's part of its stream while a log tab is shown.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from app.backend.contracts import LogLine
from app.backend.engine.controller import EngineController
from app.backend.engine.logs.loglines import LogFilter, StreamChoice

STREAMS: list[StreamChoice] = ["both", "stdout", "stderr"]
TAIL_LINES = 100000  # ask for the whole in-memory tail (the log store keeps its own bound)
VIEWS_KEPT = 16  # distinct views (filters) followed at once; the least recently asked is dropped


def render_lines(kept: Iterable[LogLine], view: LogFilter) -> str:
    """The kept lines as a log box shows them, each tagged with its stream (out/err) when both are shown."""
    tag = view.stream == "both"
    return "\n".join((f"{ln.stream[3:]} | " if tag else "") + ln.text for ln in kept)


def log_text(lines: Iterable[LogLine], view: LogFilter, show: int) -> str:
    """The last `show` lines the view keeps (a saved run's file, or the tail read whole)."""
    return render_lines(view.apply(lines)[-show:], view)


@dataclass
class _Followed:
    """One view's lines: `kept` holds (index in the run, line), at most `show`."""

    show: int
    version: int = -1
    last: LogLine | None = None  # the newest line of the tail seen (found again by identity)
    seen: int = 0  # lines of the tail seen since the last reset: the next line's index
    kept: deque[tuple[int, LogLine]] = field(default_factory=deque)
    text: str = ""


class LiveTail:
    """The live log's text per view, shared by every page: recomputed only when the log moved, and then only
    from the lines that arrived since (a new run, or more new lines than the tail holds: read whole)."""

    _of: weakref.WeakKeyDictionary[EngineController, LiveTail] = weakref.WeakKeyDictionary()
    _of_lock = threading.Lock()

    def __init__(self, ctl: EngineController) -> None:
        self.ctl = ctl
        self._lock = threading.Lock()
        self._views: OrderedDict[tuple[LogFilter, int], _Followed] = OrderedDict()

    @classmethod
    def of(cls, ctl: EngineController) -> LiveTail:
        """The one LiveTail of this controller (the Engine and Logs tabs share it)."""
        with cls._of_lock:
            tail = cls._of.get(ctl)
            if tail is None:
                tail = cls._of[ctl] = cls(ctl)
            return tail

    def text(self, view: LogFilter, show: int) -> str:
        """The last `show` lines of the live log that `view` keeps, as `log_text` renders them."""
        with self._lock:
            key = (view, show)
            f = self._views.get(key)
            if f is None:
                f = self._views[key] = _Followed(show, kept=deque(maxlen=show))
                while len(self._views) > VIEWS_KEPT:
                    self._views.popitem(last=False)
            self._views.move_to_end(key)
            version = self.ctl.logs.version
            if f.version != version:
                f.version = version
                self._follow(f, view, self.ctl.recent_logs(TAIL_LINES))
            return f.text

    @staticmethod
    def _follow(f: _Followed, view: LogFilter, lines: list[LogLine]) -> None:
        start = None
        if f.last is not None:
            for i in range(len(lines) - 1, -1, -1):
                if lines[i] is f.last:
                    start = i + 1
                    break
        changed = False
        if start is None:  # first look, a new run (the tail was cleared), or the whole tail is new
            f.kept.clear()
            f.seen, start, changed = 0, 0, True
        first = f.seen - start  # the index of lines[0] in the run
        new = lines[start:]
        keep = view.apply(new)  # a subsequence of `new`: matched back by identity for the indexes
        j = 0
        for i, ln in enumerate(new):
            if j < len(keep) and keep[j] is ln:
                f.kept.append((first + start + i, ln))
                j += 1
        changed = changed or bool(keep)
        f.seen = first + len(lines)
        while f.kept and f.kept[0][0] < first:  # gone from the in-memory tail: gone from the view too
            f.kept.popleft()
            changed = True
        f.last = lines[-1] if lines else None
        if changed:
            f.text = render_lines((ln for _, ln in f.kept), view)


def view_of(query: Mapping[str, str]) -> LogFilter:
    """A log view from a page's stream query (page-feed.js: the Stream radio, the Filter box, the probes box)."""
    stream = query.get("stream", "both")
    return LogFilter(stream if stream in STREAMS else "both", query.get("needle", ""),  # type: ignore[arg-type]
                     query.get("probes") == "1")


class TailStream:
    """One page's live log box while its tab is shown: {"text": {elem_id: text}} when what it would show moved
    (the first poll always: the page compares it with what it shows, and writes nothing when equal)."""

    def __init__(self, tail: LiveTail | None, elem_id: str, view: LogFilter, show: int,
                 shown: Callable[[str], str] = lambda text: text) -> None:
        self.tail, self.elem_id, self.view, self.show, self.shown = tail, elem_id, view, show, shown
        self.sent: str | None = None

    def poll(self) -> dict[str, object] | None:
        if self.tail is None:  # a saved run, or Follow live off: the box is the page's own
            return None
        text = self.shown(self.tail.text(self.view, self.show))
        if text == self.sent:
            return None
        self.sent = text
        return {"text": {self.elem_id: text}}
