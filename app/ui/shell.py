"""What every tab receives besides `AppState`: the page-wide pieces (`Shell`) and the event options the
tabs share. Tabs import this module, never app.ui.app (which imports the tabs)."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

import gradio as gr

from app.backend.contracts import EngineSnapshot, EngineWatch

log = logging.getLogger("moet_panel.ui")


@dataclass
class Shell:
    """Page-wide pieces shared by tabs."""

    timer: gr.Timer  # 1 s page timer (on_tick); tick handlers only read backend caches
    tabs: gr.Tabs | None = None  # set once the Tabs exist (the header is built above them)
    blocks: gr.Blocks | None = None  # the page, for its load event
    loaders: list[tuple[Callable[..., Any], list[Any], list[Any]]] = field(default_factory=list)
    tickers: list[tuple[Callable[..., Any], list[Any], list[Any]]] = field(default_factory=list)
    # The page's view of the engine: one watch for the whole UI (made by build_ui, closed with the state). A
    # redraw keeps the `seq` it last drew in a gr.State and answers gr.skip() while no change event came
    # (`engine_now`). Why the 1 s timer stays rather than a generator per page that yields on each event
    # (docs/engine.md, "Who listens"): Gradio 6.31 runs each step of a sync generator on anyio's worker threads
    # (one 40-thread limit shared by every sync handler), so a page parked in a wait holds one of them for the
    # whole wait, and a closed tab is noticed only when its stream loop next wakes (up to 10 s); some dozens of
    # open pages would stall every click. The timer holds no thread between ticks and costs one small event.
    engine: EngineWatch | None = None

    def engine_now(self) -> tuple[int, EngineSnapshot]:
        """(seq of the last engine change, the snapshot it made); (0, a blank snapshot) without an engine."""
        return self.engine.current() if self.engine is not None else (0, EngineSnapshot())

    def on_tick(self, fn: Callable[..., Any], inputs: list[Any] | None, outputs: list[Any]) -> None:
        """Redraw `outputs` from `fn(*inputs)` on the 1 s page timer. Every tab's redraw runs in ONE event
        (`finish`): one request a second per open page instead of one per tab (idle cost, bench/idle_cpu.py),
        and the header and the Engine tab drawn from the same moment's snapshot (issue 29: they disagreed
        during a switch)."""
        self.tickers.append((fn, list(inputs or []), list(outputs)))

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
        if self.tickers:
            tick_all = _combined(list(self.tickers))
            self.timer.tick(tick_all, [c for _, ins, _ in self.tickers for c in ins],
                            [c for _, _, outs in self.tickers for c in outs], trigger_mode="once",
                            api_visibility="private", **QUICK)

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
