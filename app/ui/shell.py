"""What every tab receives besides `AppState`: the page-wide pieces (`Shell`) and the event options the
tabs share. Tabs import this module, never app.ui.app (which imports the tabs)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

import gradio as gr

from app.backend.contracts import EngineSnapshot, EngineWatch
from app.backend.web.pagefeed import TopicStream

log = logging.getLogger("moet_panel.ui")


class Poke:
    """What tabs hang their live redraws on (`shell.timer.tick(fn, inputs, outputs, **event options)`, the
    former 1 s page timer's call): the handler runs when the page feed says the current topic changed
    (app.backend.web.pagefeed, assets/js/page-feed.js), not every second. Registered by `Shell.finish` on the
    topic's hidden trigger button."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell

    def tick(self, fn: Callable[..., Any], inputs: Any = None, outputs: Any = None, **options: Any) -> None:
        self.shell.pushed.append((self.shell.topic, fn, inputs, outputs, options))


@dataclass
class Shell:
    """Page-wide pieces shared by tabs."""

    tabs: gr.Tabs | None = None  # set once the Tabs exist (the header is built above them)
    blocks: gr.Blocks | None = None  # the page, for its load event
    loaders: list[tuple[Callable[..., Any], list[Any], list[Any]]] = field(default_factory=list)
    # Live redraws per topic ("header" or a tab's id; `topic` is set by build_ui before each tab renders). No
    # page timer (issue 42, docs/ui-and-safety.md#the-page-feed): each topic has a version (`version`), the
    # page's one server-sent stream says when it moved, and the page script presses the topic's hidden
    # trigger only while that part is on screen. An idle page sends no event at all.
    topic: str = "header"
    tickers: dict[str, list[tuple[Callable[..., Any], list[Any], list[Any]]]] = field(default_factory=dict)
    pushed: list[tuple[str, Callable[..., Any], Any, Any, dict[str, Any]]] = field(default_factory=list)
    versions: dict[str, Callable[[], object] | None] = field(default_factory=dict)
    # Parts the feed itself draws (element id -> its HTML): no Gradio event at all, the page script sets it
    # when it changed (the header strip: on every tab, it changes with the GPU's memory).
    live_html: dict[str, Callable[[], str]] = field(default_factory=dict)
    live_topics: dict[str, str] = field(default_factory=dict)  # element id -> its topic (sent only while shown)
    # A tab's own part of the page's stream, made per page while that tab is shown (the Telemetry plots' points).
    streams: dict[str, Callable[[Mapping[str, str]], TopicStream]] = field(default_factory=dict)
    # The page's view of the engine: one watch for the whole UI (made by build_ui, closed with the state). A
    # redraw keeps the `seq` it last drew in a gr.State and answers gr.skip() while no change event came
    # (`engine_now`). The header's and the Engine tab's versions are what they show of the snapshot, so a change
    # event that changes what they show reaches the page within the feed's period (docs/engine.md, "Who listens").
    engine: EngineWatch | None = None

    def __post_init__(self) -> None:
        self.timer = Poke(self)

    def engine_now(self) -> tuple[int, EngineSnapshot]:
        """(seq of the last engine change, the snapshot it made); (0, a blank snapshot) without an engine."""
        return self.engine.current() if self.engine is not None else (0, EngineSnapshot())

    def version(self, fn: Callable[[], object]) -> None:
        """What the current topic shows, cheaply (its repr is digested): the topic is redrawn on a page only
        when this moved. Read once a second for all pages together, from the feed's thread: backend caches only.
        Several calls for one topic combine."""
        prev = self.versions.get(self.topic)
        if prev is None:
            self.versions[self.topic] = fn
        else:
            self.versions[self.topic] = lambda: (prev(), fn())

    def live(self, elem_id: str, fn: Callable[[], str]) -> str:
        """The element `elem_id` (inside a gr.HTML) is drawn by the page feed from `fn()` whenever its text
        changed: no event, no Gradio re-render. Returns its first HTML (for the component's value)."""
        self.live_html[elem_id] = fn
        self.live_topics[elem_id] = self.topic
        return f'<div id="{elem_id}" data-live="1">{fn()}</div>'

    def stream(self, make: Callable[[Mapping[str, str]], TopicStream]) -> None:
        """While the current tab is shown, its page's stream carries `make(query)`'s part too (the query holds
        the page's settings for it, e.g. the Telemetry window)."""
        self.streams[self.topic] = make

    def on_tick(self, fn: Callable[..., Any], inputs: list[Any] | None, outputs: list[Any]) -> None:
        """Redraw `outputs` from `fn(*inputs)` when the current topic's version moved and it is shown. A
        topic's redraws run in ONE event (`finish`), and the header and the Engine tab read the same
        moment's snapshot (issue 29: they disagreed during a switch)."""
        self.tickers.setdefault(self.topic, []).append((fn, list(inputs or []), list(outputs)))

    def on_load(self, fn: Callable[..., Any], inputs: list[Any] | None, outputs: list[Any]) -> None:
        """Run `fn` when a page (or a reload) opens: every list and choice is filled from the backend as it
        is now, not as it was when the panel built the page (issue 29: runs made since were missing).
        All tabs' loaders run as ONE event (`finish`): one request per page open, one atomic redraw."""
        self.loaders.append((fn, list(inputs or []), list(outputs)))

    def finish(self) -> None:
        """Register the page's one load event (after every tab has added its loaders). Its last output,
        `#moet-loaded[data-loaded=1]`, tells a test (or a script) the page now shows the backend's state."""
        if self.blocks is None:
            return
        marker = gr.HTML('<div data-loaded="0"></div>', elem_id="moet-loaded", visible="hidden")
        loaders = list(self.loaders)
        inputs = [c for _, ins, _ in loaders for c in ins]
        outputs = [c for _, _, outs in loaders for c in outs]
        run_loaders = _combined(loaders)

        def load_all(*values: Any) -> tuple[Any, ...]:
            return (*run_loaders(*values), '<div data-loaded="1"></div>')

        self.blocks.load(load_all, inputs, [*outputs, marker], api_visibility="private", **QUICK)
        # One hidden trigger per topic, outside the tabs (a tab's content may not be mounted yet), pressed by
        # assets/js/page-feed.js. "always_last": a change during a redraw is drawn after it, never dropped.
        topics = [*self.tickers, *(t for t, *_ in self.pushed if t not in self.tickers)]
        buttons = {t: gr.Button(t, visible="hidden", elem_id=f"moet-poke-{t}", elem_classes=["moet-poke"])
                   for t in topics}
        for topic, handlers in self.tickers.items():
            buttons[topic].click(_combined(handlers), [c for _, ins, _ in handlers for c in ins],
                                 [c for _, _, outs in handlers for c in outs], trigger_mode="always_last",
                                 api_visibility="private", **QUICK)
        for topic, fn, ins, outs, options in self.pushed:
            options = {"trigger_mode": "always_last", "api_visibility": "private", **QUICK, **options}
            buttons[topic].click(fn, ins, outs, **options)
        for topic in topics:
            self.versions.setdefault(topic, None)

    def on_tab(self, title: str, fn: Callable[..., Any], inputs: list[Any] | None, outputs: list[Any]) -> None:
        """Run `fn(*inputs)` when the tab `title` is opened; another tab's opening changes nothing."""
        if self.tabs is None:
            return
        n = len(inputs or [])

        def opened(*args: Any) -> Any:
            evt: gr.SelectData = args[n]
            if evt.value != title:
                return gr.skip() if len(outputs) == 1 else tuple(gr.skip() for _ in outputs)
            return fn(*args[:n])

        # Gradio passes the tab's SelectData to the parameter annotated with it (inspect.signature +
        # get_type_hints): give the wrapper that signature
        params = [inspect.Parameter(f"a{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(n)]
        params.append(inspect.Parameter("evt", inspect.Parameter.POSITIONAL_ONLY, annotation=gr.SelectData))
        opened.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        opened.__annotations__ = {"evt": gr.SelectData}
        self.tabs.select(opened, inputs, outputs, **QUICK)


class QuickEvent(TypedDict):
    show_progress: Literal["hidden"]
    concurrency_limit: None


# Handlers that only read backend caches or hand work to a backend thread: no spinner, no queue slot limit.
QUICK: QuickEvent = {"show_progress": "hidden", "concurrency_limit": None}


def _combined(handlers: list[tuple[Callable[..., Any], list[Any], list[Any]]]) -> Callable[..., tuple[Any, ...]]:
    """One function running each handler on its slice of the inputs; its outputs concatenated. A handler
    that fails leaves its outputs as they are (logged), the others still redraw."""

    def run_all(*values: Any) -> tuple[Any, ...]:
        out: list[Any] = []
        at = 0
        for fn, ins, outs in handlers:
            try:
                got = fn(*values[at:at + len(ins)])
                out.extend(got if len(outs) > 1 else (got,))
            except Exception:
                log.exception("page redraw failed in %s", getattr(fn, "__qualname__", fn))
                out.extend(gr.skip() for _ in outs)
            at += len(ins)
        return tuple(out)

    return run_all
