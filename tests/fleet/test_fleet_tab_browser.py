"""The Fleet tab in a browser (docs/fleet.md, "One dashboard"; issue 51 item 5): a front panel with two SIMULATED
boxes on loopback. Each box is a demo panel in a process of its own — its page, its /metrics, its gateway with the
fleet key, its engine on the process runtime (tests/fleet/panelbox.py); the front is this test's panel, with the
real vllm-router. The tab shows each box's state, profile, tok/s (non-zero while a client streams through the
front) and the router's health; a box stopped shows down within seconds. The table is drawn by the page feed
itself: no Gradio event while its figures move. Screenshots at 1280×800 and 390×844 in test-artifacts/."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from app.backend.config.settings import resolve_settings
from app.backend.engine.supervision.desired import DesiredStore
from app.backend.fleet import fleetfile
from app.backend.gateway.keys import KeyStore
from app.backend.recipe import SIMULATED_RECIPE
from bench.fleet.netboxes import recipe_copy
from tests.conftest import ARTIFACTS, ROOT, Panel, close_panel, free_port, launch_panel
from tests.polling import wait_for
from tests.ui.a11y import horizontal_overflow, unlabelled_controls

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PROFILE = "quality"
MODEL = "deepseek-v4-flash"
DECODE_TOK_S = 40.0  # each SIMULATED engine's decode rate (one slot each)
DOWN_WITHIN_S = 10.0  # a stopped box shown down: the view's 2 s refresh, a refused connection, the feed's 1 s


@dataclass
class Box:
    name: str
    data: Path
    port: int = field(default_factory=free_port)  # its panel: the page and /metrics
    gw_port: int = field(default_factory=free_port)  # its gateway: the router's worker URL
    state_dir: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.data.parent / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.gw_port}"


def start_box(b: Box, recipe: Path, fleet_key: str) -> None:
    """The box's data dir as `moet-panel keys create front --scope fleet` and a started engine leave it (the
    fleet key accepted; the engine wished to serve, so the panel brings it up), its gateway switch on, then its
    panel."""
    b.data.mkdir(parents=True)
    b.state_dir = resolve_settings(recipe, b.data, demo=True).ensure_state_dir()
    (b.state_dir / "gateway.json").write_text(json.dumps({"on": True, "port": b.gw_port}))
    keys = KeyStore(b.state_dir)
    try:
        keys.create("front", scope="fleet", key=fleet_key)
    finally:
        keys.close()
    DesiredStore(b.state_dir).write("serve", PROFILE, "test")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOET_PANEL_", "GRADIO_"))}
    env.update(PYTHONPATH=str(ROOT), XDG_DATA_HOME=str(b.data / "share"), MOET_PANEL_GPU="simulated",
               MOET_PANEL_GATEWAY_HOST="127.0.0.1")
    with open(b.log, "wb") as log:
        b.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fleet.panelbox", "serve", "--demo", "--recipe", str(recipe),
             "--data-dir", str(b.data), "--port", str(b.port)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def box_serves(b: Box) -> bool:
    assert b.proc is not None and b.proc.poll() is None, f"box {b.name} ended:\n{b.log.read_text()[-3000:]}"
    try:
        return httpx.get(b.url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def stop_box(b: Box, sig: int = signal.SIGTERM) -> None:
    """Its panel and gateway (their process group), then its engine: a process of its own session, as a container
    outlives its panel; found by the runtime's records, killed only if it is still the process recorded."""
    if b.proc is not None and b.proc.poll() is None:
        os.killpg(b.proc.pid, sig)
        try:
            b.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(b.proc.pid, signal.SIGKILL)
            b.proc.wait(timeout=10)
    for rec_path in (b.state_dir / "engine-procs").glob("*.json") if b.state_dir else ():
        try:
            rec = json.loads(rec_path.read_text())
            p = psutil.Process(int(rec["pid"]))
            if abs(p.create_time() - float(rec["create_time"])) < 1.0:
                os.killpg(p.pid, signal.SIGKILL)
        except (OSError, ValueError, KeyError, psutil.Error):
            pass


@dataclass
class FleetRun:
    front: Panel
    boxes: list[Box]
    gateway: str  # the front's gateway: what clients call
    client_key: str


@pytest.fixture(scope="module")
def fleet_run() -> Iterator[FleetRun]:
    home = Path.home() / f"moet-fleettab-{uuid.uuid4().hex[:10]}"
    home.mkdir()
    boxes = [Box(f"b{i}", home / f"b{i}") for i in (1, 2)]
    front: Panel | None = None
    try:
        recipe = recipe_copy(home, f"fleettab-{uuid.uuid4().hex[:8]}", DECODE_TOK_S)
        front_data = home / "front"
        state_dir = resolve_settings(SIMULATED_RECIPE, front_data, demo=True).ensure_state_dir()
        cfg = fleetfile.new_fleet(state_dir, router_port=free_port(), router_metrics_port=free_port())
        for b in boxes:
            start_box(b, recipe, cfg.fleet_key)
            cfg = fleetfile.with_box(cfg, fleetfile.Box(b.name, b.url, f"http://127.0.0.1:{b.port}/metrics"))
        fleetfile.store(state_dir).write(cfg)
        gw_port = free_port()
        (state_dir / "gateway.json").write_text(json.dumps({"on": True, "port": gw_port}))
        keys = KeyStore(state_dir)
        try:
            client_key = keys.create("client").key
        finally:
            keys.close()
        for b in boxes:
            wait_for(lambda b=b: box_serves(b), 240, f"box {b.name}'s gateway serving (its engine ready)", 0.5)
        front = launch_panel(front_data)
        run = FleetRun(front, boxes, f"http://127.0.0.1:{gw_port}", client_key)
        wait_for(lambda: ask(run).status_code == 200, 120, "the front's gateway answering through the router", 0.5)
        yield run
    finally:
        if front is not None:
            close_panel(front)
        for b in boxes:
            stop_box(b)
        for b in boxes:  # kept for a failing run's reader
            if b.log.exists():
                ARTIFACTS.mkdir(exist_ok=True)
                shutil.copyfile(b.log, ARTIFACTS / f"fleettab-{b.name}.log")
        shutil.rmtree(home, ignore_errors=True)


def ask(run: FleetRun, stream: bool = False, max_tokens: int = 40) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count"}], "max_tokens": max_tokens,
            "stream": stream}
    headers = {"Authorization": f"Bearer {run.client_key}"}
    if not stream:
        try:
            return httpx.post(run.gateway + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        except httpx.HTTPError:
            return httpx.Response(599)
    with httpx.stream("POST", run.gateway + "/v1/chat/completions", json=body, headers=headers, timeout=60) as r:
        for _ in r.iter_lines():  # read to its end, as a client does
            pass
        return r


class Streaming:
    """Two clients streaming answers through the front in a loop (round robin: both boxes answer)."""

    def __init__(self, run: FleetRun) -> None:
        self.run, self.stop = run, threading.Event()
        self.codes: list[object] = []
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(2)]

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.codes.append(ask(self.run, stream=True).status_code)
            except httpx.HTTPError as exc:
                self.codes.append(type(exc).__name__)

    def __enter__(self) -> Streaming:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=90)


ROWS_JS = """() => Object.fromEntries([...document.querySelectorAll('#fleet-boxes tr[data-box]')].map(tr =>
  [tr.dataset.box, Object.fromEntries([...tr.querySelectorAll('td[data-col]')].map(td =>
    [td.dataset.col, td.innerText.trim()]))]))"""


def rows(page: Any) -> dict[str, dict[str, str]]:
    return dict(page.evaluate(ROWS_JS))


def rate(cell: str) -> float:
    return 0.0 if cell in ("", "—") else float(cell)


def tab_select(post: str | None) -> bool:
    """A Gradio event sent for the Fleet tab's selection (its SelectData names the tab)."""
    try:
        data = json.loads(post or "")
    except ValueError:
        return False
    return isinstance(data, dict) and (data.get("event_data") or {}).get("id") == "fleet"


def open_fleet_tab(browser: Any, run: FleetRun, width: int, height: int) -> Any:
    page = browser.new_page(width, height)
    page.goto(run.front.url)
    page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached", timeout=60_000)
    page.get_by_role("tab", name="Fleet").click()
    page.wait_for_selector("#fleet-boxes tr[data-box='b2']", timeout=30_000)
    return page


def test_the_fleet_tab_shows_each_box_live_and_a_stopped_box_down(fleet_run: FleetRun, browser: Any) -> None:
    run = fleet_run
    ARTIFACTS.mkdir(exist_ok=True)
    page = open_fleet_tab(browser, run, 1280, 800)
    # both boxes serving their profile, listed healthy by the router
    wait_for(lambda: all(r.get("state") == "serving" and r.get("router") == "healthy"
                         and r.get("profile-per-gpu") == PROFILE for r in rows(page).values())
             and len(rows(page)) == 2, 30, f"both boxes serving and healthy on the tab: {rows(page)}", 0.25)
    assert "SIMULATED" in page.inner_text("#fleet-boxes")  # the boxes' engines and GPUs are doubles, and say so
    assert "router pid" in page.inner_text("#fleet-router")

    # Gradio events from here on (the queue's join route), but the Fleet tab's own selection (other tabs'
    # "opened" handlers, answered with a skip; sent as the tab was clicked): the tab's figures move without any
    events: list[str] = []
    page.on("request", lambda r: events.append(str(r.post_data)) if "/queue/join" in r.url and not tab_select(
        r.post_data) else None)
    page.evaluate("() => { document.getElementById('fleet-boxes').__first = 1; }")
    with Streaming(run) as clients:
        moving = wait_for(lambda: (lambda rs: rs if all(rate(r["tok-s"]) > 0 for r in rs.values()) else None)(
            rows(page)), 60, f"tok/s above 0 on both boxes while clients stream: {rows(page)}", 0.25)
        page.screenshot(path=str(ARTIFACTS / "fleet-tab-1280x800.png"), full_page=True)
        narrow = open_fleet_tab(browser, run, 390, 844)
        wait_for(lambda: all(rate(r["tok-s"]) > 0 for r in rows(narrow).values()), 30,
                 f"the narrow page's tok/s: {rows(narrow)}", 0.25)
        narrow.screenshot(path=str(ARTIFACTS / "fleet-tab-390x844.png"), full_page=True)
        fits = {"wide": (horizontal_overflow(page), unlabelled_controls(page)),
                "narrow": (horizontal_overflow(narrow), unlabelled_controls(narrow))}
    assert all(c == 200 for c in clients.codes), clients.codes
    for name, r in moving.items():  # the engines decode at DECODE_TOK_S, one answer at a time each
        assert 0 < rate(r["tok-s"]) <= 1.5 * DECODE_TOK_S, (name, r)
    for size, (overflow, unlabelled) in fits.items():  # as every tab (tests/ui/test_all_tabs_a11y.py)
        assert overflow["page"] <= 1 and overflow["main"] <= 1 and not unlabelled, (size, overflow, unlabelled)
    assert events == [], events  # drawn by the page feed: no Gradio event while tok/s moved
    assert page.evaluate("() => document.getElementById('fleet-boxes').__first") == 1  # patched in place

    # box b2 gone at once (its panel and gateway killed, as a crash or a power cut): shown down within seconds, with
    # no rate; b1 still serving
    b2 = next(b for b in run.boxes if b.name == "b2")
    t0 = time.monotonic()
    stop_box(b2, signal.SIGKILL)
    wait_for(lambda: rows(page)["b2"]["state"].startswith("down"), DOWN_WITHIN_S,
             f"b2 shown down on the tab: {rows(page)}", 0.1)
    shown = time.monotonic()
    print(f"tok/s while streaming: { {n: r['tok-s'] for n, r in moving.items()} }; b2 killed -> shown down "
          f"{shown - t0:.2f} s")
    wait_for(lambda: rows(page)["b2"]["router"] != "healthy", DOWN_WITHIN_S,
             f"b2 no longer healthy in the router, on the tab: {rows(page)}", 0.1)
    now = rows(page)
    assert now["b2"]["tok-s"] == "—", now
    assert now["b1"]["state"] == "serving" and now["b1"]["router"] == "healthy", now
    page.screenshot(path=str(ARTIFACTS / "fleet-tab-box-down-1280x800.png"), full_page=True)
    wait_for(lambda: rows(narrow)["b2"]["state"].startswith("down"), DOWN_WITHIN_S, "b2 down on the narrow page", 0.1)
    narrow.screenshot(path=str(ARTIFACTS / "fleet-tab-box-down-390x844.png"), full_page=True)
    overflow = horizontal_overflow(narrow)
    assert overflow["page"] <= 1 and overflow["main"] <= 1, ("a box down at 390 px (its error's URL)", overflow)
    assert ask(run).status_code == 200  # the front still serves, through b1
    assert not browser.console_errors, browser.console_errors
