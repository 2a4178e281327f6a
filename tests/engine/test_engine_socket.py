"""The engine out of the browser's reach (issue 40, docs/engine.md "Where the engine listens"): the SIMULATED
engine, started by the panel's own controller on real Docker, listens on a unix socket in a 0700 directory of
the state dir. A page served from another local port, in a real headless Chromium, tries the engine's old TCP
address (fetch, a no-cors text/plain POST, a foreign Host as DNS rebinding gives) and the engine generates
nothing; no TCP port of the engine is open; another user of the box cannot connect to the socket."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from app.backend.contracts import EngineState
from app.backend.engine.supervision.canary import load_from_metrics
from app.backend.engine.runtime.client import engine_client
from app.backend.config.settings import Settings
from app.backend.simengine.image import ensure_image, source_digest
from tests.conftest import free_port
from tests.polling import wait_for
from tests.gateway.sockets import container_listening, listening

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3.11"  # readable by another user (the venv's lives under /root, 0700)

ATTACK_PAGE = """<!doctype html><meta charset="utf-8"><title>a page the owner opened</title><script>
const body = JSON.stringify({model: "deepseek-v4-flash", prompt: "attack", max_tokens: 32});
const targets = %(targets)s;
window.results = [];
(async () => {
  for (const url of targets) {
    for (const init of [{mode: "no-cors", method: "POST", body: body},
                        {mode: "no-cors", method: "POST", body: body, headers: {"Content-Type": "text/plain"}},
                        {method: "GET"}]) {
      try { const r = await fetch(url, init); window.results.push([url, init.method, "answered " + r.type]); }
      catch (e) { window.results.push([url, init.method, "refused: " + e]); }
    }
  }
  window.done = true;
})();
</script>"""


@contextmanager
def attacker_site(html: str) -> Iterator[str]:
    """A web page on another local port (127.0.0.1:<free port>), as any site the owner opens could serve."""
    page = html.encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    finally:
        httpd.shutdown()
        httpd.server_close()


def raw_post(port: int, host_header: str) -> str:
    """A completion POST to 127.0.0.1:<port> carrying a foreign Host, as a DNS-rebound page sends it."""
    body = json.dumps({"model": "deepseek-v4-flash", "prompt": "rebound", "max_tokens": 32}).encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: " + host_header.encode() +
                      b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
                      b"\r\nConnection: close\r\n\r\n" + body)
            return s.recv(200).decode(errors="replace").split("\r\n", 1)[0]
    except OSError as exc:
        return f"refused: {exc}"


def tokens(url: str) -> tuple[float, float]:
    """(generated, prompt) token counters of the engine, read from its /metrics over its own address."""
    load = load_from_metrics(engine_client(url).metrics().text)
    return load.generated or 0.0, load.prompted or 0.0


def other_user_connect(dir_fd: int, rel: str) -> str:
    """Connect to the socket as user nobody. The parent of the socket's directory is handed over as an open
    fd, so the data dir's own ancestors (under /root, 0700) do not stand in the way: only the socket
    directory's mode decides."""
    code = ("import socket\ns = socket.socket(socket.AF_UNIX)\n"
            f"try:\n    s.connect('/proc/self/fd/{dir_fd}/{rel}')\n    print('connected')\n"
            "except OSError as e:\n    print('refused', e.errno)\n")
    r = subprocess.run([SYSTEM_PYTHON, "-c", code], user=NOBODY, group=NOBODY, pass_fds=(dir_fd,),
                       capture_output=True, text=True, timeout=30)
    return r.stdout.strip() or r.stderr.strip()[-300:]


@pytest.mark.slow
def test_no_web_page_reaches_the_engine_and_no_other_user_does(make_controller, docker_client, sim_settings,
                                                              browser) -> None:
    if os.geteuid() != 0 or not Path(SYSTEM_PYTHON).exists():
        pytest.fail("this test runs as root with the system Python (it starts a process as user nobody)")
    # this source's image, under a tag of its own: the shared tag may be rebuilt meanwhile from another checkout
    tag = ensure_image(docker_client, tag=f"moet-panel/sim-engine:src-{source_digest()}")
    recipe = sim_settings.recipe
    # no generation canary: the engine's token counters must move only for what the attacker gets through
    engine = recipe.engine.model_copy(update={"image": tag, "canary_interval_s": 0})
    recipe = recipe.model_copy(update={"engine": engine})
    settings = Settings(recipe_path=sim_settings.recipe_path, recipe=recipe, data_dir=sim_settings.data_dir, demo=True)
    ctl = make_controller(settings, canary_interval_s=0.0)
    port = recipe.serve.port  # where the engine listened before issue 40 (127.0.0.1:<port>)
    ctl.start("quality")
    wait_for(lambda: ctl.snapshot().state is EngineState.READY, 90, "the simulated engine ready")
    url = ctl.snapshot().base_url
    before = tokens(url)

    # (a) the attacker's page, on another local port, in a real Chromium: fetch, no-cors POSTs (the default
    # text/plain and an explicit one), and a foreign Host name that resolves to loopback (*.localhost in
    # Chromium), as DNS rebinding gives a page
    targets = [f"http://127.0.0.1:{port}/v1/completions", f"http://rebind.localhost:{port}/v1/completions"]
    with attacker_site(ATTACK_PAGE % {"targets": json.dumps(targets)}) as site:
        page = browser.new_page()
        page.goto(site)
        page.wait_for_function("window.done === true", timeout=60_000)
        results = page.evaluate("window.results")
    rebound = raw_post(port, "attacker.example")
    # the engine generated nothing for any of it: its own counters, read over its socket
    assert tokens(url) == before, f"the engine counted tokens for the page: {before} -> {tokens(url)}: {results}"
    assert len(results) == 6 and all(r[2].startswith("refused") for r in results), results
    assert rebound.startswith("refused"), f"the engine's old port answered a foreign Host: {rebound}"

    # where it listens: a unix socket in <state dir>/engine-sock, and no TCP port at all
    assert url.startswith("unix:"), url
    sock = Path(url.removeprefix("unix:"))
    assert sock == settings.state_dir / "engine-sock" / "engine.sock" and stat.S_ISSOCK(sock.stat().st_mode)
    container = docker_client.containers.get(ctl.snapshot().container_id)
    assert container_listening(container) == [], "the engine's processes listen on TCP"
    assert [s for s in listening(container.attrs["State"]["Pid"]) if s[1] == port] == []
    assert not container.attrs["HostConfig"].get("PortBindings"), "a port of the engine is published"

    # (b) the socket's directory is the panel user's and 0700: another user of the box cannot connect
    st = sock.parent.stat()
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid(), oct(st.st_mode)
    fd = os.open(settings.state_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert other_user_connect(fd, "engine-sock/engine.sock") == "refused 13"  # EACCES
    finally:
        os.close(fd)
    # and the panel itself still serves through it: a real completion counts tokens
    with engine_client(url).stream_chat({"model": recipe.model.served_name, "max_tokens": 3,
                                         "messages": [{"role": "user", "content": "hi"}]}) as stream:
        assert any(chunk.get("choices") for chunk in stream)
    wait_for(lambda: tokens(url)[0] > before[0], 10, "the panel's own completion counted by the engine")
