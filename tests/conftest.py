"""Shared fixtures (append yours at the end; keep them tidy).

- `free_port()` — an unused TCP port on 127.0.0.1.
- `browser` — headless Debian Chromium via Playwright; `new_page(browser_ctx)` helpers below.
  A failing test's pages are screenshotted into test-artifacts/; browser console errors are collected.
- `panel` — an AppState for a temp data dir (simulated recipe) + `build_ui` launched on a free port.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
# The explicit step that refreshes the README/docs screenshots (README "Tests"): only with this set to 1
# does `BrowserSession.snap(..., docs=NAME)` copy its screenshot to docs/NAME.png; a normal run writes
# only to test-artifacts/ and never changes tracked files.
DOCS_SCREENSHOTS_ENV = "MOET_PANEL_DOCS_SCREENSHOTS"
NARROW_WIDTH = 420  # the narrow-window check of every docs screenshot (test-artifacts/<name>-420.png)
CHROMIUM = "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The quick tier (`./run-tests.sh -m "not slow"`, README "Tests"): whatever starts a container, a browser, a
# panel or a real engine is slow by that fact, marked here once rather than remembered in every test.
SLOW_FIXTURES = frozenset({"docker_client", "sim_settings", "make_controller", "sim_image", "recipe_file", "browser",
                           "shared_panel", "panel", "live", "real_docker", "demo_state", "make_gateway"})
SLOW_MARKERS = ("docker", "browser", "real_engine")


# ./run-tests.sh runs the suite in pytest-xdist workers with `--dist loadfile`: each test file on one worker, so a
# module-scoped fixture (a booted vLLM, a fleet of namespaces, a Prometheus) is set up once. Not `loadgroup`: with
# pytest 9.2 its xdist_group marks are silently ignored (pytest-xdist issue 1386: it renames node ids, which pytest
# 9.2 no longer reads).


@pytest.hookimpl(tryfirst=True)  # before the tmp_path plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    """A distributed run's workers put their tmp_path under <basetemp>/popen-gwN, 10 bytes deeper than a plain run's,
    and a panel whose data dir is a tmp_path binds its engine's unix socket under it: at most 107 bytes
    (app/backend/recipe/endpoint.py). So the controller's basetemp is short, one per checkout and user,
    /tmp/mpt-XXXXXX (cleared by pytest when the next run starts, as --basetemp is): a worker's tmp_path is then
    shorter than a plain run's /tmp/pytest-of-USER/pytest-N."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput") and not config.option.basetemp:
        key = hashlib.sha256(f"{ROOT}:{os.getuid()}".encode()).hexdigest()[:6]
        config.option.basetemp = str(Path(tempfile.gettempdir()) / f"mpt-{key}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(item.get_closest_marker(m) for m in SLOW_MARKERS) or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)


_RUNNING: list[pytest.Item] = []  # the test being run (close_panel asks whether it failed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    _RUNNING.append(item)
    try:
        yield
    finally:
        _RUNNING.remove(item)


def _failing() -> bool:
    """An exception on its way out (a `with serving(...)` left by a failed assertion) or a failed test call."""
    rep = getattr(_RUNNING[-1], "rep_call", None) if _RUNNING else None
    return sys.exc_info()[0] is not None or (rep is not None and rep.failed)


@pytest.fixture
def oplog_lines() -> Iterator[io.StringIO]:
    """What the operator's log receives during the test (app/backend/oplog/__init__.py), whatever its sinks."""
    from app.backend import oplog

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root = logging.getLogger(oplog.ROOT)
    old = root.level
    root.setLevel(logging.INFO)
    root.addHandler(handler)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(old)


# --- browser ---------------------------------------------------------------------------------------

@dataclass
class BrowserSession:
    """Pages opened through `new_page` record console errors and are screenshotted if the test fails."""

    browser: Any
    pages: list[Any] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)

    def new_page(self, width: int = 1280, height: int = 800) -> Any:
        ctx = self.browser.new_context(viewport={"width": width, "height": height})
        page = ctx.new_page()
        page.set_default_timeout(20_000)
        page.on("console", lambda m: self.console_errors.append(f"{m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: self.console_errors.append(f"pageerror: {e}"))
        self.pages.append(page)
        return page

    def snap(self, page: Any, name: str, full_page: bool = True, docs: str | None = None,
             clip_to: str | None = None) -> Path:
        """Save a step screenshot as a test artifact (test-artifacts/<name>.png).

        `docs`: the README/docs image this step illustrates. The page is also shot NARROW_WIDTH px wide
        (test-artifacts/<name>-420.png, to look at), and docs/<docs>.png is refreshed from the wide shot
        only when MOET_PANEL_DOCS_SCREENSHOTS=1. `clip_to`: a CSS selector; the shot ends below it."""
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.png"
        self._shoot(page, path, full_page, clip_to)
        if docs is not None:
            size = page.viewport_size
            page.set_viewport_size({"width": NARROW_WIDTH, "height": size["height"]})
            try:
                self._settle(page)
                self._shoot(page, path.with_name(f"{path.stem}-{NARROW_WIDTH}.png"), full_page, clip_to)
            finally:
                page.set_viewport_size(size)
            if os.environ.get(DOCS_SCREENSHOTS_ENV) == "1":
                shutil.copyfile(path, ROOT / "docs" / f"{docs}.png")
        return path

    @staticmethod
    def _settle(page: Any) -> None:
        """After a resize, wait (5 s at most) until the page fits the new width: the charts re-lay out a
        frame or two later. A page that still overflows is shot as it is: that is a defect to see."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            page.wait_for_function("() => document.documentElement.scrollWidth <= window.innerWidth + 1",
                                   timeout=5_000)
        except PlaywrightTimeout:
            pass

    @staticmethod
    def _shoot(page: Any, path: Path, full_page: bool, clip_to: str | None) -> None:
        if clip_to is None:
            page.screenshot(path=str(path), full_page=full_page)
            return
        page.locator(clip_to).first.scroll_into_view_if_needed()
        box = page.evaluate("s => { const r = document.querySelector(s).getBoundingClientRect();"
                            " return {bottom: r.bottom + window.scrollY, width: document.documentElement.scrollWidth}; }",
                            clip_to)
        page.screenshot(path=str(path), full_page=True,
                        clip={"x": 0, "y": 0, "width": box["width"], "height": box["bottom"] + 12})


@pytest.fixture(scope="session")
def _chromium() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (./run-tests.sh installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


_SESSIONS: list[BrowserSession] = []  # the open `browser` fixtures' sessions (close_panel closes their pages first)


def close_pages_on(url: str) -> None:
    """Close the pages open on `url`, as a user closes the tab before the panel stops. A page left open keeps its
    event streams to the panel, and Gradio's close waits up to 5 s for them (its server thread's join timeout)."""
    for session in _SESSIONS:
        for page in [p for p in session.pages if p.url == url or p.url.startswith(url + "/")]:
            if not page.is_closed():
                page.context.close()
            session.pages.remove(page)


@pytest.fixture
def browser(_chromium: Any, request: pytest.FixtureRequest) -> Iterator[BrowserSession]:
    session = BrowserSession(_chromium)
    _SESSIONS.append(session)
    try:
        yield session
    finally:
        _SESSIONS.remove(session)
        rep = getattr(request.node, "rep_call", None)
        failed = rep is not None and rep.failed
        for i, page in enumerate(session.pages):
            if failed:
                ARTIFACTS.mkdir(exist_ok=True)
                name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid)[-120:]
                try:
                    page.screenshot(path=str(ARTIFACTS / f"FAILED-{name}-{i}.png"), full_page=True)
                except Exception:
                    pass
            page.context.close()


# --- panel ------------------------------------------------------------------------------------------

@dataclass
class Panel:
    url: str
    state: Any
    blocks: Any
    data_dir: Path


@contextmanager
def serve_demo_process(port: int, log_path: Path, env: dict[str, str], timeout: float) -> Iterator[subprocess.Popen[bytes]]:
    """`moet-panel serve --demo` in a process group of its own, its output in `log_path`: yielded once its banner
    says it runs (within `timeout`), stopped on exit (SIGTERM to the group; SIGKILL after 30 s)."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "serve", "--demo", "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while "moet-panel is running" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)  # polling with a deadline
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def launch_panel(data_dir: Path, *, recipe: str | Path | None = None, auth: Any = None, demo: bool = True) -> Panel:
    from app.backend.recipe import SIMULATED_RECIPE
    from app.backend.config.settings import resolve_settings
    from app.backend.state import build_app_state

    settings = resolve_settings(recipe or SIMULATED_RECIPE, data_dir, demo=demo)
    settings.ensure_state_dir()
    return launch_state(build_app_state(settings), auth=auth)


def launch_state(state: Any, *, auth: Any = None) -> Panel:
    """Build and launch the UI for a prepared AppState; the state is closed if the launch fails."""
    from app.ui.app import build_ui, launch

    try:
        blocks = build_ui(state)
        url = launch(blocks, "127.0.0.1", free_port(), auth, state=state)
    except BaseException:
        state.close()
        raise
    return Panel(url=url.rstrip("/"), state=state, blocks=blocks, data_dir=Path(state.settings.data_dir))


def close_panel(panel: Panel) -> None:
    """Close the panel's pages (unless the test is failing: the `browser` fixture screenshots them), the UI, the
    state."""
    if not _failing():
        close_pages_on(panel.url)
    try:
        panel.blocks.close()
    finally:
        panel.state.close()


@contextmanager
def serving(state: Any) -> Iterator[Panel]:
    """launch_state as a context: the panel and its state are closed on exit (a failed launch closes the state)."""
    panel = launch_state(state)
    try:
        yield panel
    finally:
        close_panel(panel)


@contextmanager
def demo_panel(prefix: str) -> Iterator[Panel]:
    """The panel in demo mode (simulated recipe) on a free loopback port, with a temp data dir."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        p = launch_panel(Path(tmp))
        try:
            yield p
        finally:
            close_panel(p)


@pytest.fixture(scope="session")
def shared_panel() -> Iterator[Panel]:
    """One demo panel for read-only browser tests (building the services costs seconds)."""
    with demo_panel("moet-panel-shared-") as p:
        yield p


@pytest.fixture
def panel() -> Iterator[Panel]:
    """The panel in demo mode (simulated recipe) on a free loopback port, with a temp data dir."""
    with demo_panel("moet-panel-test-") as p:
        yield p


# --- the panel's engine, on its unix socket (issue 40) -------------------------------------------------------

def engine_openai(url: str, **kw: Any) -> Any:
    """The real `openai` SDK for an engine address from a snapshot: `unix:/…/engine.sock` (over that socket, as
    the panel's chat reaches it) or http://host:port."""
    import httpx2  # the openai SDK's HTTP client
    import openai

    from app.backend.engine.runtime.client import EngineEndpoint, api_base, is_uds

    if is_uds(url):
        kw["http_client"] = httpx2.Client(transport=httpx2.HTTPTransport(uds=EngineEndpoint.parse(url).uds))
    return openai.OpenAI(base_url=api_base(url), **{"api_key": "EMPTY", "max_retries": 0, **kw})
