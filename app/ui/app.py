"""Build the Gradio Blocks app: header strip + one tab per capability.

Each tab module in TABS exposes:
    TITLE: str                                          # tab label
    def render(state: AppState, shell: Shell) -> None   # called inside `with gr.Tab(TITLE)` (app.ui.shell)
Tab modules only call backend services on `state`; they never talk to Docker/NVML/HTTP directly.
"""

from __future__ import annotations

import html
import importlib
import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import gradio as gr

from app.backend.config import env
from app.backend.web.exports import exports_dir, remove_web_temp_dir, sweep_web_temp_dirs, web_temp_dir
from app.backend.web import pagefeed
from app.backend.state import AppState
from app.backend.web.gate import GatePolicy, SessionGuard, WebGate
from app.ui import header, idlequeue, servertick
from app.ui.shell import Shell

ASSETS = Path(__file__).resolve().parents[2] / "assets"
CSS_PATH = ASSETS / "css" / "panel.css"
SESSION_SCRIPT = ASSETS / "js" / "session-key.js"  # the page script of signed-in sessions (auth on)
AUTH_MESSAGE = "moet-panel controls Docker on this machine: sign in to continue."

# Tab modules in display order.
TABS = [
    "app.ui.profiles",
    "app.ui.downloads",
    "app.ui.engine",
    "app.ui.logs",
    "app.ui.telemetry",
    "app.ui.selftest",
    "app.ui.abtest",
    "app.ui.gateway",
    "app.ui.service",
    "app.ui.fleet",  # a fleet's front only (fleet.shown)
    "app.ui.chat",  # keep last
]


# The page's Shell (its topics and their versions, for the page feed), set by build_ui, read by launch.
SHELL_ATTR = "moet_shell"
FEED_ATTR = "moet_feed"  # the page feed's route, set by launch
# the page feed's client (app.backend.web.pagefeed) and the Telemetry tab's streamed plots
FEED_SCRIPTS = (ASSETS / "js" / "page-feed.js", ASSETS / "js" / "telemetry-plots.js")
# Gradio's leaked loading-timer loop slowed to once a second: served first in the page's <head> by the gate,
# before Gradio's modules read requestAnimationFrame (issue 49; docs/ui-and-safety.md, "The page feed")
IDLE_FRAMES_SCRIPT = ASSETS / "js" / "idle-frames.js"

# The one folder the web server may serve files from besides its own cache (set by build_ui, read by launch).
ALLOWED_PATHS_ATTR = "moet_allowed_paths"


def prepare_web_files(state: AppState) -> Path:
    """Files handed to the browser stay in the panel's 0700 state dir (app/backend/web/exports.py): Gradio's
    upload/cache folder becomes `<state>/gradio-<pid>` (removed when the state closes; a dead panel's is
    swept), exports go to `<state>/exports`. Must run before any component is built: each one reads the
    folder when it is created."""
    state_dir = state.settings.ensure_state_dir()
    sweep_web_temp_dirs(state_dir)
    temp = web_temp_dir(state_dir)
    env.point_web_temp_dir(temp)
    state.on_close(lambda: remove_web_temp_dir(temp))
    return exports_dir(state_dir)


def build_ui(state: AppState) -> gr.Blocks:
    exports = prepare_web_files(state)
    with gr.Blocks(title="moet-panel") as demo:
        setattr(demo, ALLOWED_PATHS_ATTR, [str(exports)])
        if state.settings.demo:
            why = state.settings.demo_reason
            gr.HTML(
                '<div class="moet-sim-banner" role="status">SIMULATED — demo mode: the engine, GPU and Hub on '
                "this page are simulated stand-ins; figures shown are the model card's."
                + (f"<br><small>Why demo mode: {html.escape(why)}</small>" if why else "") + "</div>",
                elem_id="sim-banner",
            )
        # The header strip sits above the tabs; its live part is the page feed's "header" topic.
        shell = Shell(blocks=demo)
        setattr(demo, SHELL_ATTR, shell)
        if state.engine is not None:  # one subscription for every page (docs/engine.md, "Who listens")
            shell.engine = state.engine.watch()
            state.on_close(shell.engine.close)
        header.render(state, shell)
        # "wrap": on a narrow window every tab stays in sight on a second row (Gradio's default hid five of
        # the eight behind "…" at 420 px, issue 29)
        with gr.Tabs(elem_id="main-tabs", overflow_behavior="wrap") as tabs:
            shell.tabs = tabs
            for name in TABS:
                module = importlib.import_module(name)
                if not getattr(module, "shown", lambda _state: True)(state):
                    continue  # a tab only some panels have (the Fleet tab: a fleet's front)
                tab_id = name.rsplit(".", 1)[-1]
                shell.topic = tab_id  # the page feed's topic of what this tab registers (app.ui.shell)
                with gr.Tab(module.TITLE, id=tab_id, elem_id=f"tab-{tab_id}"):
                    module.render(state, shell)
        shell.topic = "header"
        shell.finish()
    return demo


def css_text() -> str:
    return CSS_PATH.read_text() if CSS_PATH.exists() else ""


def launch_kwargs(auth: Callable[[str, str], Any] | None = None) -> dict[str, Any]:
    """Arguments for `Blocks.launch()` shared by `moet-panel serve` and the tests (Gradio 6: theme/css here)."""
    from app.ui.theme import make_theme

    kwargs: dict[str, Any] = {
        "theme": make_theme(),
        "css": css_text(),
        "footer_links": [],  # no API/"built with" links: the panel is not an API product
        "show_error": False,  # tracebacks stay in the server log (redacted), not in the page
        "quiet": True,
        # Gradio features the panel does not use, off (docs/ui-and-safety.md#routes): run history
        # (its routes call the Hub with the process's HF token), MCP, monitoring, SSR's Node
        # server, PWA; uploads capped at the chat import's size.
        "run_history": False,
        "mcp_server": False,
        "enable_monitoring": False,
        "ssr_mode": False,
        "pwa": False,
        "strict_cors": True,
        "max_file_size": "16mb",
        # the page feed's client: presses a part's hidden trigger when its version moved and it is shown
        "head": "".join(f"<script>{js.read_text()}</script>" for js in FEED_SCRIPTS),
    }
    if auth is not None:
        kwargs["auth"] = auth
        kwargs["auth_message"] = AUTH_MESSAGE
    return kwargs


def hide_api(blocks: gr.Blocks) -> None:
    """Mark every event "private": Gradio 6.31 embeds the API description (endpoint names, component
    labels, defaults) in the page it serves to *unauthenticated* visitors, and the Gradio client could
    call public endpoints. With auth on, the browser UI is the only client the panel needs."""
    for fn in blocks.fns.values():
        fn.api_visibility = "private"


def gradio_session(app: Any) -> SessionGuard:
    """The gate's view of Gradio's sessions (its cookies and token table) plus the page script that
    binds a session to the panel's origin (app.backend.web.gate.SessionGuard)."""

    def read_token(cookies: dict[str, str]) -> str | None:
        return cookies.get(f"access-token-{app.cookie_id}") or cookies.get(f"access-token-unsecure-{app.cookie_id}")

    return SessionGuard(read_token=read_token, token_user=lambda token: app.tokens.get(token),
                        forget=lambda token: app.tokens.pop(token, None), page_script=SESSION_SCRIPT.read_text())


def _gate_lifespan(policy_for: Callable[[Any], GatePolicy]) -> Callable[[Any], Any]:
    """Put the WebGate in front of Gradio's whole middleware stack (its CORS middleware included,
    so a foreign preflight is refused, not answered) when the server starts, before it accepts a
    connection: uvicorn runs the lifespan first. `add_middleware` cannot do this: Gradio adds its
    own middleware outermost after the app exists."""

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        if app.middleware_stack is None:
            raise RuntimeError("the web app has no middleware stack at startup: cannot install the gate")
        app.middleware_stack = WebGate(app.middleware_stack, policy_for(app))
        yield

    return lifespan


def launch(blocks: gr.Blocks, host: str, port: int, auth: Callable[[str, str], Any] | None = None,
           allowed_hosts: tuple[str, ...] = (), state: AppState | None = None, metrics_token: str | None = None) -> str:
    """Launch without blocking (the caller decides how to wait); returns the local URL. Every
    request passes app.backend.web.gate first (Host/Origin allow-lists, session, CSP). With `state`,
    the gate also serves /metrics (open without auth, else only to `metrics_token`; docs/metrics.md)."""
    if auth is not None:
        hide_api(blocks)
    # the plots' library, from its Debian package (scripts/bootstrap.sh), served by the panel itself (CSP 'self')
    routes: tuple[tuple[str, Any], ...] = tuple(
        (f"{pagefeed.ASSET_PREFIX}{name}", pagefeed.AssetRoute(pagefeed.DYGRAPHS_DIR / name, kind, "libjs-dygraphs"))
        for name, kind in (("dygraph.min.js", "text/javascript; charset=utf-8"), ("dygraph.min.css", "text/css")))
    page_routes: tuple[tuple[str, Any], ...] = ()
    shell = getattr(blocks, SHELL_ATTR, None)
    if shell is not None:
        feed = pagefeed.FeedRoute(pagefeed.Versions(shell.versions, html=shell.live_html),
                                  html_topics=shell.live_topics, streams=shell.streams)
        page_routes = ((pagefeed.PATH, feed),)
        setattr(blocks, FEED_ATTR, feed)  # for tests and benches: its versions' computation count
    if state is not None:
        from app.backend.prometheus.access import PATH, MetricsAccess, MetricsRoute

        routes += ((PATH, MetricsRoute(state, MetricsAccess(auth_on=auth is not None, token=metrics_token))),)

    def policy_for(app: Any) -> GatePolicy:
        return GatePolicy(port=port, bind_host=host, allowed_hosts=allowed_hosts,
                          sessions=gradio_session(app) if auth is not None else None, auth_message=AUTH_MESSAGE,
                          fn_index_ok=lambda index: index in blocks.fns,
                          routes=routes, page_routes=page_routes, on_refusal=state.counters.refused if state is not None else None,
                          page_script=IDLE_FRAMES_SCRIPT.read_text())

    # An IPv6 literal goes to Gradio in brackets: it builds its own URLs as f"http://{name}:{port}/".
    server_name = f"[{host.strip('[]')}]" if ":" in host.strip("[]") else host
    idlequeue.install(blocks)  # before launch: the queue's loop starts with it (no 1 ms idle poll)
    servertick.install()  # before launch: the web server's tick once a second (not 0.1 s), woken by close()
    # Gradio's launch then HEADs the page with a 3 s timeout and refuses to start when that times out ("When localhost
    # is not accessible, a shareable link must be created"): a loaded run of the suite failed so (9 errors), as would a
    # panel started on a box busy extracting. Its startup-events request just before has shown the server answers;
    # `_frontend=False` skips only that HEAD (gradio/blocks.py), when this Gradio has it.
    skip_head: dict[str, Any] = {"_frontend": False} if "_frontend" in inspect.signature(blocks.launch).parameters else {}
    app, url, _ = blocks.launch(server_name=server_name, server_port=port, prevent_thread_lock=True, **skip_head,
                                app_kwargs={"lifespan": _gate_lifespan(policy_for),
                                            # no FastAPI schema/docs pages: the panel is not an API product
                                            "openapi_url": None, "docs_url": None, "redoc_url": None},
                                # only the exports folder; Gradio adds its own cache (docs/ui-and-safety.md)
                                allowed_paths=list(getattr(blocks, ALLOWED_PATHS_ATTR, [])), **launch_kwargs(auth))
    if not isinstance(app.middleware_stack, WebGate):  # never serve without the gate
        blocks.close()
        raise RuntimeError("the panel's HTTP gate is not installed; refusing to serve")
    return str(url)
