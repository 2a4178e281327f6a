"""Benchmark: keyed requests while one address floods the gateway with idle connections (issue 40).

    .venv/bin/python bench/gateway/flood.py [--idle 2500] [--requests 40] [--tok-s 400]

Processes: the SIMULATED engine and `moet-panel gateway` in front of it (as bench/gateway/run.py starts them).
A flood thread holds --idle connections that send nothing, opening a new one whenever the gateway closes one
(an attacker that keeps at it), from 127.0.0.2 (another address) and then from 127.0.0.1 (the keyed client's
own address). Meanwhile the driver sends --requests keyed 3-token chat requests, half on a kept-alive client
and half each on a fresh connection. Prints per case: the flood's connections open at the end and reopened,
the keyed requests' status counts and latency p50 / p95 / max (goal: every one answered in < 1 s).
Before issue 40, 2,200 idle connections got every keyed request a 503 (the global 2,048 cap).
"""

from __future__ import annotations

import argparse
import resource
import selectors
import socket
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gateway.run import pct  # noqa: E402
from bench.gateway.stack import MODEL, gateway_stack  # noqa: E402


class Flood:
    """Holds `n` idle connections from `source` to `port`, reopening each one the gateway closes."""

    def __init__(self, port: int, source: str, n: int):
        self.port, self.source, self.n = port, source, n
        self.sel = selectors.DefaultSelector()
        self.open = 0
        self.reopened = 0
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _connect(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((self.source, 0))
            s.connect(("127.0.0.1", self.port))
        except OSError:
            s.close()
            self.failed += 1
            return
        s.setblocking(False)
        self.sel.register(s, selectors.EVENT_READ)
        self.open += 1

    def _run(self) -> None:
        while self.open < self.n and not self._stop.is_set():
            self._connect()
        while not self._stop.is_set():
            for k, _ in self.sel.select(0.05):
                s = k.fileobj
                assert isinstance(s, socket.socket)
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    self.sel.unregister(s)
                    s.close()
                    self.open -= 1
            while self.open < self.n and not self._stop.is_set():
                self._connect()
                self.reopened += 1

    def __enter__(self) -> Flood:
        self._thread.start()
        deadline = time.monotonic() + 30
        while self.open + self.failed < self.n and time.monotonic() < deadline:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for k in list(self.sel.get_map().values()):
            k.fileobj.close()  # type: ignore[union-attr]


def keyed(httpx: object, url: str, key: str, n: int) -> tuple[list[float], dict[int, int]]:
    import httpx as hx

    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    headers = {"Authorization": f"Bearer {key}"}
    lat: list[float] = []
    codes: dict[int, int] = {}
    with hx.Client(timeout=30) as kept:
        for i in range(n):
            t0 = time.monotonic()
            try:
                if i % 2:
                    r = kept.post(url + "/v1/chat/completions", json=body, headers=headers)
                else:
                    with hx.Client(timeout=30) as fresh:
                        r = fresh.post(url + "/v1/chat/completions", json=body, headers=headers)
                code = r.status_code
            except hx.HTTPError:
                code = 0
            lat.append(time.monotonic() - t0)
            codes[code] = codes.get(code, 0) + 1
    return lat, codes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", type=int, default=2500)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--tok-s", type=float, default=400.0)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.idle + 256:  # this driver holds the flood's sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.idle * 2 + 256), hard))
    import httpx

    with gateway_stack("moet-bench-flood-", args.tok_s, 256) as st:
        gateway, gw_port, key = st.gateway, st.gw_port, st.keys["bench"]
        lat, codes = keyed(httpx, gateway, key, args.requests)
        print(f"no flood: keyed requests {codes}, latency p50 {pct(lat, 0.5) * 1e3:.1f} ms, p95 "
              f"{pct(lat, 0.95) * 1e3:.1f} ms, max {max(lat) * 1e3:.1f} ms")
        for source, what in (("127.0.0.2", "another address"), ("127.0.0.1", "the keyed client's own address")):
            with Flood(gw_port, source, args.idle) as flood:
                lat, codes = keyed(httpx, gateway, key, args.requests)
                print(f"{args.idle} idle connections from {source} ({what}): keyed requests {codes}, latency p50 "
                      f"{pct(lat, 0.5) * 1e3:.1f} ms, p95 {pct(lat, 0.95) * 1e3:.1f} ms, max {max(lat) * 1e3:.1f} ms; "
                      f"flood held {flood.open} open at the end, reopened {flood.reopened}, refused {flood.failed}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
