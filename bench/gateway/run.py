"""Benchmark: the API gateway vs the engine directly, against the SIMULATED engine, in one run.

    .venv/bin/python bench/gateway/run.py [--tokens 20000] [--tok-s 200] [--ttft-runs 40] [--idle 64] [--streams 8]

Processes: the simulated engine (`python -m app.backend.simengine`, decoding at --tok-s per request) and
`moet-panel gateway` in front of it (a key made with `moet-panel keys create --json`), each in its own
process; this driver talks to both with raw SSE over httpx (one client per side, the same code). Prints:

* TTFT (request sent → first token's chunk) direct and through the gateway, interleaved pairs; the
  added TTFT as p50 and p99 of the paired differences (issue 31 goals: p50 ≤ 1 ms, p99 ≤ 5 ms).
* a --tokens stream (default 20k at 200 tok/s, ~100 s) direct and through the gateway side by side, at the
  same time: tokens received (0 lost: the same count and text), decode rate (gateway/direct ≥ 99 %).
* the gateway's RSS with --idle keep-alive clients (each made one request, then idle) and --streams
  concurrent streams, and its CPU per 1,000 tok/s over those streams (goal: RSS ≤ 100 MiB).
* then the TTFT pairs and the long stream again while the panel is busy (`--busy`, default on): a demo
  panel (`moet-panel serve --demo`, engine stopped, its own recipe id and port) with headless Chromium
  (Debian's, through Playwright) on its Telemetry tab, charts updating; the panel's and the browser's CPU
  are printed beside (goal: p99 added ≤ 5 ms).
* then the same with **the panel's own gateway** (`--panel-gateway`, default on with `--busy`): a demo panel
  whose gateway switch was left on (restored at start, so it runs as the panel's child process, fed the
  engine's status on stdin), its SIMULATED engine started on Docker (`moet-panel engine start`, this run's
  recipe copy: its own id and port, --tok-s, boot 0 s), Chromium on its Telemetry tab; direct = that engine.

Figures on a shared 2-core box are noisy: read them side by side, not against a fixed number.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gateway.stack import MODEL, gateway_stack, wait_http  # noqa: E402
from bench.panelproc import free_port, panel_env, recipe_copy, stop_group, wait_running  # noqa: E402



class KeyRing:
    """Keys taken in turn: the panel's gateway keeps its default per-key rate (120/min), so the bench spreads
    its requests over several keys instead of changing the panel's limits."""

    def __init__(self, keys: list[str]) -> None:
        self.keys, self.i = keys, 0

    def next(self) -> str:
        self.i += 1
        return self.keys[self.i % len(self.keys)]


def stream(client: Any, url: str, key: str | KeyRing | None, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One streamed chat: TTFT, first/last token times, token count (from content chunks), text."""
    if isinstance(key, KeyRing):
        key = key.next()
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True, "chat_template_kwargs": {"thinking": False},
            "stream_options": {"include_usage": True}}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    t0 = time.perf_counter()
    first = last = None
    n = tokens = 0
    parts: list[str] = []
    with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            if obj.get("usage"):
                tokens = obj["usage"]["completion_tokens"]  # the engine's count (the gateway passes it when asked)
            if not obj.get("choices"):
                continue
            text = obj["choices"][0]["delta"].get("content") or ""
            if text:
                now = time.perf_counter()
                first = first or now
                last = now
                parts.append(text)
                n += 1
    return {"ttft": (first - t0) if first else None, "first": first, "last": last, "chunks": n, "tokens": tokens,
            "text": "".join(parts)}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=20000)
    ap.add_argument("--tok-s", type=float, default=200.0)
    ap.add_argument("--ttft-runs", type=int, default=40)
    ap.add_argument("--idle", type=int, default=64)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--nodelay", action="store_true", help="the driver's clients set TCP_NODELAY")
    ap.add_argument("--stream-tokens", type=int, default=2000, help="tokens per stream in the RSS/CPU part")
    ap.add_argument("--busy", action=argparse.BooleanOptionalAction, default=True,
                    help="measure TTFT and the long stream again with a busy panel (browser on its Telemetry tab)")
    ap.add_argument("--standalone", action=argparse.BooleanOptionalAction, default=True,
                    help="the standalone `moet-panel gateway` parts (--no-standalone: only the panel's own gateway)")
    ap.add_argument("--panel-gateway", action=argparse.BooleanOptionalAction, default=True,
                    help="with --busy: measure the busy panel's own gateway (its child process) too (needs Docker)")
    args = ap.parse_args()

    import httpx
    import psutil

    if not args.standalone:
        with tempfile.TemporaryDirectory(prefix="moet-bench-gw-") as tmp:
            return panel_gateway_part(args, Path(tmp), httpx, psutil)
    with gateway_stack("moet-bench-gw-", args.tok_s, 256, gateway_args=("--max-concurrent", "1000")) as st:
        gw, engine, gateway, key, tmp = st.gateway_proc, st.engine, st.gateway, st.keys["bench"], st.tmp
        code = run(args, engine, gateway, key, psutil.Process(gw.pid), httpx)
        if args.busy:
            with BusyPanel(tmp) as busy:
                print(f"\n--- again, the panel busy: a demo panel with headless Chromium on its Telemetry tab "
                      f"({busy.url}) ---")
                busy.mark()
                run(args, engine, gateway, key, psutil.Process(gw.pid), httpx, quick=True)
                print(f"  (meanwhile: panel CPU {busy.panel_cpu():.0f} % of a core, Chromium "
                      f"{busy.browser_cpu():.0f} %)")
        if args.busy and args.panel_gateway:
            panel_gateway_part(args, tmp, httpx, psutil)
        return code


def panel_gateway_part(args: argparse.Namespace, tmp: Path, httpx: Any, psutil: Any) -> int:
    with BusyPanel(tmp, gateway=True, tok_s=args.tok_s) as busy:
        print(f"\n--- the panel's own gateway (its child process, pid {busy.gateway_pid}; the panel pid "
              f"{busy.proc.pid}) in front of the panel's SIMULATED engine on Docker, the panel busy "
              f"(Chromium on its Telemetry tab, {busy.url}) ---")
        busy.mark()
        code = run(args, busy.engine_url, busy.gateway_url, busy.key, psutil.Process(busy.gateway_pid), httpx,
                   quick=True)
        print(f"  (meanwhile: panel CPU {busy.panel_cpu():.0f} % of a core, Chromium {busy.browser_cpu():.0f} %)")
    return code


class BusyPanel:
    """A demo panel (engine stopped, its own recipe id and port, XDG_DATA_HOME under `tmp`) and headless Chromium
    on its Telemetry tab, for the duration of a `with` block; both stopped at its end."""

    def __init__(self, tmp: Path, gateway: bool = False, tok_s: float = 200.0) -> None:
        import psutil

        self.dir = tmp / ("busy-panel-gateway" if gateway else "busy-panel")
        self.dir.mkdir()
        recipe, self.recipe_id = recipe_copy(ROOT, self.dir, f"bench-gw-{os.getpid()}")
        self.gateway = gateway
        self.port = free_port()
        env = panel_env(ROOT, self.dir)
        self.env = env
        self.cli = [sys.executable, "-m", "app.cli.main", "--demo", "--recipe", str(recipe), "--data-dir",
                    str(self.dir / "data")]
        self.key = KeyRing([""])
        self.gateway_pid = 0
        self.gateway_url = self.engine_url = ""
        self._engine_started = False
        if gateway:
            import re

            from app.backend.gateway.switch import DesiredGateway, save_desired

            # the engine: several sequences (the side-by-side stream), the bench's decode rate, no boot wait
            text = recipe.read_text().replace('"--max-num-seqs", "1"', '"--max-num-seqs", "256"')
            text = text.replace('MOET_SIM_BOOT_S = "4"', f'MOET_SIM_BOOT_S = "0"\nMOET_SIM_DECODE_TOK_S = "{tok_s:g}"'
                                '\nMOET_SIM_REASONING_MODE = "none"')
            recipe.write_text(text)
            m = re.search(r"^port = (\d+)", text, re.M)
            assert m, "no serve port in the recipe copy"
            self.engine_url = f"http://127.0.0.1:{m.group(1)}"
            made = []
            for i in range(20):  # 20 × 120 requests a minute (the panel's default per-key rate)
                out = subprocess.run([*self.cli, "keys", "create", f"bench{i}", "--json"], env=env, cwd=ROOT,
                                     check=True, capture_output=True, text=True).stdout
                made.append(json.loads(out)["key"])
            self.key = KeyRing(made)
            gw_port = free_port()
            self.gateway_url = f"http://127.0.0.1:{gw_port}"
            # the switch left on: the panel starts its gateway process at start-up, as after a restart
            save_desired(self.dir / "data" / ".moet-panel", DesiredGateway(on=True, port=gw_port))
        self.log = open(self.dir / "panel.log", "w")
        self.proc = subprocess.Popen([*self.cli, "serve", "--port", str(self.port)], cwd=ROOT, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.ps = psutil.Process(self.proc.pid)
        self.pw: Any = None
        self.browser: Any = None
        self._cpu0: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> BusyPanel:
        try:
            wait_running(self.proc, self.dir / "panel.log")
            if self.gateway:
                self._engine_started = True
                started = subprocess.run([*self.cli, "engine", "start", "--profile", "quality"], env=self.env, cwd=ROOT,
                                         capture_output=True, text=True, timeout=300)
                if started.returncode != 0:
                    raise SystemExit(f"the panel's engine did not start: {started.stdout[-2000:]}{started.stderr[-2000:]}")
                wait_http(self.engine_url + "/health", timeout=120)
                # 200 through the panel's gateway: its child got the panel's "ready" on stdin
                try:
                    # once a second: a key's default rate is 2 a second, and a faster poll while the panel has
                    # not yet seen the engine ready would keep that key at 429 after it has
                    wait_http(self.gateway_url + "/v1/models", {"Authorization": f"Bearer {self.key.keys[0]}"},
                              timeout=120, interval=1.0)
                except SystemExit as exc:
                    raise SystemExit(f"{exc}\npanel log:\n{(self.dir / 'panel.log').read_text()[-3000:]}") from None
                kids = [p for p in self.ps.children() if "--status-from-stdin" in p.cmdline()]
                if len(kids) != 1:
                    raise SystemExit(f"expected one gateway child of the panel, found {kids}")
                self.gateway_pid = kids[0].pid
            from playwright.sync_api import sync_playwright

            self.pw = sync_playwright().start()
            self.browser = self.pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                                   args=["--no-sandbox"])
            page = self.browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
            page.goto(self.url)
            page.wait_for_selector('#moet-loaded [data-loaded="1"]', state="attached", timeout=60_000)
            page.get_by_role("tab", name="Telemetry").click()
            time.sleep(3)  # the charts' first draw, so the measurement sees the steady updates
        except BaseException:
            self.__exit__()
            raise
        return self

    def _browser_procs(self) -> list[Any]:
        import psutil

        me = psutil.Process()
        return [p for p in me.children(recursive=True) if "chrom" in p.name().lower()]

    def _cpu(self, procs: list[Any]) -> float:
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except Exception:  # a renderer that went away
                pass
        return total

    def mark(self) -> None:
        self._cpu0 = (time.monotonic(), self._cpu([self.ps]), self._cpu(self._browser_procs()))

    def panel_cpu(self) -> float:
        return 100 * (self._cpu([self.ps]) - self._cpu0[1]) / (time.monotonic() - self._cpu0[0])

    def browser_cpu(self) -> float:
        return 100 * (self._cpu(self._browser_procs()) - self._cpu0[2]) / (time.monotonic() - self._cpu0[0])

    def __exit__(self, *exc: object) -> None:
        try:
            if self.browser is not None:
                self.browser.close()
            if self.pw is not None:
                self.pw.stop()
        finally:
            if self._engine_started:  # only this run's engine: its recipe copy's own id
                subprocess.run([*self.cli, "engine", "stop"], env=self.env, cwd=ROOT, capture_output=True, timeout=120)
                ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=moet-panel.recipe={self.recipe_id}"],
                                     capture_output=True, text=True, timeout=60).stdout.split()
                if ids:
                    subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=120)
            stop_group(self.proc)
            self.log.close()


def run(args: argparse.Namespace, engine: str, gateway: str, key: str | KeyRing, gw_proc: Any, httpx: Any,
        quick: bool = False) -> int:
    """TTFT pairs, the long stream side by side and (unless `quick`) RSS/CPU with idle clients and streams."""
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    # clients as the OpenAI SDK makes them (httpx, Nagle on), or with TCP_NODELAY (--nodelay)
    opts = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)] if args.nodelay else []
    direct_c = httpx.Client(timeout=None, limits=limits, transport=httpx.HTTPTransport(socket_options=opts, limits=limits))
    gw_c = httpx.Client(timeout=None, limits=limits, transport=httpx.HTTPTransport(socket_options=opts, limits=limits))
    print(f"gateway benchmark: simulated engine at {args.tok_s:g} tok/s per request; gateway pid {gw_proc.pid}")

    # 1. TTFT, interleaved pairs (warm connections on both sides)
    stream(direct_c, engine, None, "warm", 4)
    stream(gw_c, gateway, key, "warm", 4)
    d_ttft, g_ttft, added = [], [], []
    for i in range(args.ttft_runs):
        order = [(direct_c, engine, None), (gw_c, gateway, key)]
        if i % 2:
            order.reverse()
        res = {}
        for c, url, k in order:
            res[url] = stream(c, url, k, f"ttft probe {i}", 4)["ttft"]
        d_ttft.append(res[engine] * 1000)
        g_ttft.append(res[gateway] * 1000)
        added.append((res[gateway] - res[engine]) * 1000)
    print(f"\nTTFT over {args.ttft_runs} interleaved pairs, ms     p50      p99")
    print(f"  direct                                  {pct(d_ttft, .5):7.2f}  {pct(d_ttft, .99):7.2f}")
    print(f"  through the gateway                     {pct(g_ttft, .5):7.2f}  {pct(g_ttft, .99):7.2f}")
    print(f"  added by the gateway (paired diffs)     {pct(added, .5):7.2f}  {pct(added, .99):7.2f}   goal ≤ 1 / ≤ 5")

    # 2. the long stream, both sides at the same time
    results: dict[str, dict[str, Any]] = {}

    def long(name: str, c: Any, url: str, k: str | None) -> None:
        results[name] = stream(c, url, k, "the long answer", args.tokens)

    cpu0 = gw_proc.cpu_times()
    t0 = time.perf_counter()
    ts = [threading.Thread(target=long, args=("direct", direct_c, engine, None)),
          threading.Thread(target=long, args=("gateway", gw_c, gateway, key))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    cpu1 = gw_proc.cpu_times()
    d, g = results["direct"], results["gateway"]
    # tokens after the first one, over the time from the first to the last content chunk
    rate = {n: (r["tokens"] - 1) / (r["last"] - r["first"]) for n, r in results.items()}
    print(f"\n{args.tokens}-token stream at {args.tok_s:g} tok/s, side by side ({wall:.1f} s)")
    same = d["text"] == g["text"]
    print(f"  tokens (engine's count)  direct {d['tokens']}  gateway {g['tokens']}; text received identical "
          f"({len(d['text'])} characters, {d['chunks']} / {g['chunks']} SSE chunks): {same}   "
          f"tokens lost: {0 if same and d['tokens'] == g['tokens'] else 'SOME'}")
    print(f"  decode rate     direct {rate['direct']:.1f}  gateway {rate['gateway']:.1f} tok/s   "
          f"gateway/direct {rate['gateway'] / rate['direct'] * 100:.2f} %   goal ≥ 99 %")
    one = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall * 100
    print(f"  gateway CPU during one {args.tok_s:g} tok/s stream: {one:.1f} % of a core")
    if quick:
        direct_c.close()
        gw_c.close()
        return 0

    # 3. idle keep-alive clients + concurrent streams: RSS and CPU per 1,000 tok/s
    idle = [httpx.Client(timeout=None) for _ in range(args.idle)]
    for c in idle:
        c.get(gateway + "/v1/models", headers={"Authorization": f"Bearer {key}"})
    rss_idle = gw_proc.memory_info().rss
    peak = [rss_idle]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            peak.append(gw_proc.memory_info().rss)

    sampler = threading.Thread(target=sample)
    sampler.start()
    counts: list[int] = []

    def one_stream(i: int) -> None:
        counts.append(stream(gw_c, gateway, key, f"stream {i}", args.stream_tokens)["tokens"])

    cpu0 = gw_proc.cpu_times()
    t0 = time.perf_counter()
    ts = [threading.Thread(target=one_stream, args=(i,)) for i in range(args.streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    cpu1 = gw_proc.cpu_times()
    stop.set()
    sampler.join()
    # the idle clients are still connected: their connections must have survived the streams
    still = sum(c.get(gateway + "/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200 for c in idle)
    for c in idle:
        c.close()
    tok_s = sum(counts) / wall
    cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall * 100
    print(f"\n{args.idle} idle keep-alive clients + {args.streams} streams of {args.stream_tokens} tokens through the gateway")
    print(f"  gateway RSS: {rss_idle / 2**20:.1f} MiB with the idle clients, peak {max(peak) / 2**20:.1f} MiB during "
          f"the streams   goal ≤ 100 MiB")
    print(f"  throughput {tok_s:.0f} tok/s; gateway CPU {cpu:.1f} % of a core = {cpu / (tok_s / 1000):.1f} % per "
          f"1,000 tok/s; idle clients still served afterwards: {still}/{args.idle}")
    direct_c.close()
    gw_c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
