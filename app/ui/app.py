"""Build the Gradio Blocks app: header strip + one tab per capability.

Each tab module in TABS exposes:
    TITLE: str                                  # tab label
    def render(state: AppState, shell: Shell) -> None   # called inside `with gr.Tab(TITLE)`
Tab modules only call backend services on `state`; they never talk to Docker/NVML/HTTP directly.
"""

from __future__ import annotations

import html
import importlib
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Awaitable, Callable

import gradio as gr
from fastapi import Depends, FastAPI, Request
from gradio.route_utils import API_PREFIX

from app.backend.state import AppState

ASSETS = Path(__file__).resolve().parents[2] / "assets"
CSS_PATH = ASSETS / "css" / "panel.css"
# Page scripts, in the page's <head> (Gradio 6: launch(head=...)); each installs itself.
HEAD_SCRIPTS = [ASSETS / "js" / "chat_quickstart.js"]

# mount(path, endpoint): a POST route on the panel's server behind the same login as Gradio's API.
Mount = Callable[[str, Callable[..., Awaitable[Any]]], None]

# Tab modules in display order. A module is listed only once its capability has landed.
TABS = [
    "app.ui.profiles",
    "app.ui.downloads",
    "app.ui.engine",
    "app.ui.logs",
    "app.ui.telemetry",
    "app.ui.selftest",
    "app.ui.compare",
    "app.ui.chat",  # keep last
]


@dataclass
class Shell:
    """Page-wide pieces shared by tabs."""

    timer: gr.Timer  # 1 s page timer; tick handlers only read backend caches
    tabs: gr.Tabs | None = None  # set once the Tabs exist (the header is built above them)
    on_launch: list[Callable[[Mount], None]] = field(default_factory=list)  # run by launch() below



def build_ui(state: AppState) -> gr.Blocks:
    with gr.Blocks(title="moet-panel") as demo:
        timer = gr.Timer(1.0)
        try:
            header = importlib.import_module("app.ui.header")
        except ModuleNotFoundError as exc:
            if exc.name != "app.ui.header":
                raise
            header = None
        if state.settings.recipe.simulated or state.settings.demo:
            why = state.settings.demo_reason
            gr.HTML(
                '<div class="moet-sim-banner" role="status">SIMULATED — demo mode: the engine, GPU and Hub on '
                "this page are simulated stand-ins; figures shown are the model card's."
                + (f"<br><small>Why demo mode: {html.escape(why)}</small>" if why else "") + "</div>",
                elem_id="sim-banner",
            )
        # The header strip sits above the tabs; it needs the shared timer but not the Tabs object.
        shell = Shell(timer=timer)
        if header is not None:
            header.render(state, shell)
        with gr.Tabs(elem_id="main-tabs") as tabs:
            shell.tabs = tabs
            for name in TABS:
                module = importlib.import_module(name)
                with gr.Tab(module.TITLE, id=name.rsplit(".", 1)[-1], elem_id=f"tab-{name.rsplit('.', 1)[-1]}"):
                    module.render(state, shell)
    demo.moet_on_launch = shell.on_launch  # travels with the Blocks to launch(): no module-level registry
    return demo


def css_text() -> str:
    return CSS_PATH.read_text() if CSS_PATH.exists() else ""


def head_html() -> str:
    return "".join(f"<script>\n{path.read_text()}\n</script>" for path in HEAD_SCRIPTS)


def gradio_session_guard(app: FastAPI) -> Callable[[Request], Awaitable[None]]:
    """Gradio's own session check, as a dependency for the panel's routes: its `login_check` route
    function (401 without a session when auth is on, nothing when it is off) fed by its own
    `get_current_user`. Reused, not re-implemented, so these routes can never be more open than
    Gradio's API; awaited directly (Gradio's `login_check` is a plain function that FastAPI would
    otherwise run on a worker thread: a hop in front of every Send). Raises if this Gradio has no
    such route (then nothing is mounted)."""
    stack = list(app.router.routes)
    while stack:
        route = stack.pop()
        inner = getattr(route, "original_router", None)
        if inner is not None:  # FastAPI's included router (Gradio's /gradio_api)
            stack.extend(inner.routes)
        elif getattr(route, "path", None) == f"{API_PREFIX}/login_check":
            login_check = route.endpoint
            get_user = inspect.signature(login_check).parameters["user"].default.dependency
            if not inspect.iscoroutinefunction(get_user):
                raise RuntimeError("Gradio's get_current_user is not a coroutine function any more")

            async def guard(request: Request) -> None:
                login_check(await get_user(request))

            return guard
    raise RuntimeError(f"Gradio has no {API_PREFIX}/login_check route to guard the panel's own routes")


def mount_routes(blocks: gr.Blocks, app: FastAPI) -> None:
    """Add the tabs' own routes (on_launch hooks) to the launched app, behind Gradio's login."""
    hooks = getattr(blocks, "moet_on_launch", [])
    if not hooks:
        return
    guard = Depends(gradio_session_guard(app))

    def mount(path: str, endpoint: Callable[..., Awaitable[Any]]) -> None:
        app.add_api_route(path, endpoint, methods=["POST"], dependencies=[guard], include_in_schema=False)

    for hook in hooks:
        hook(mount)


def launch_kwargs(auth: Callable[[str, str], bool] | None = None) -> dict[str, Any]:
    """Arguments for `Blocks.launch()` shared by `moet-panel serve` and the tests (Gradio 6: theme/css here)."""
    from app.ui.theme import make_theme

    kwargs: dict[str, Any] = {
        "theme": make_theme(),
        "css": css_text(),
        "footer_links": [],  # no API/"built with" links: the panel is not an API product
        "enable_monitoring": False,
        "show_error": False,  # tracebacks stay in the server log (redacted), not in the page
        "quiet": True,
        "head": head_html(),
    }
    if auth is not None:
        kwargs["auth"] = auth
        kwargs["auth_message"] = "moet-panel controls Docker on this machine: sign in to continue."
    return kwargs


def hide_api(blocks: gr.Blocks) -> None:
    """Mark every event "private": Gradio 6.31 embeds the API description (endpoint names, component
    labels, defaults) in the page it serves to *unauthenticated* visitors, and the Gradio client could
    call public endpoints. With auth on, the browser UI is the only client the panel needs."""
    for fn in blocks.fns.values():
        fn.api_visibility = "private"


def launch(blocks: gr.Blocks, host: str, port: int, auth: Callable[[str, str], bool] | None = None) -> str:
    """Launch without blocking (the caller decides how to wait); returns the local URL."""
    if auth is not None:
        hide_api(blocks)
    app, url, _ = blocks.launch(server_name=host, server_port=port, prevent_thread_lock=True, **launch_kwargs(auth))
    mount_routes(blocks, app)
    return str(url)
