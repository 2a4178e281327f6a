"""Benchmark: hang-ups free the engine, two keys take turns (issue 40), and a slow reader holds no slot (issue
48/50), on the card's single stream.

    .venv/bin/python bench/gateway/fairness.py [--tok-s 48.9] [--greedy 4] [--greedy-tokens 100]
        [--slow-tokens 4096] [--stall-s 30] [--burst-every 25] [--only-slow] [--readers byte,burst]
        [--gateway-max-tokens N]

Processes: the SIMULATED engine at `--max-num-seqs 1` (the card's recipe) decoding at --tok-s, and
`moet-panel gateway --engine-slots 1` in front of it. Prints:

* abandoned: a non-streaming 400-token request whose client hangs up once the engine runs it: the time until the
  engine's `vllm:num_requests_running` is 0 (goal < 1 s; before issue 40 the engine generated all 400 tokens),
  and another key's 3-token request sent at the hang-up: its latency (before: 15.6 s).
* turns: a greedy key with --greedy requests of --greedy-tokens at once, then a polite key's 3-token request:
  its latency and how many greedy answers ended before it (goal: at most the one running when it arrived).
* slow readers: a stream of --slow-tokens (the default cap) taken by a client reading 1 byte a second (then
  nothing), and by one taking 64 KiB every --burst-every s (three times, then nothing); beside each, a polite key's
  3-token stream: its wait for its first token (goal: within one answer's time, --slow-tokens / --tok-s), and when
  the slow reader was cut after its last read (goal: within --stall-s, the gateway's setting).
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gateway.stack import MODEL, gateway_stack  # noqa: E402

MSG = [{"role": "user", "content": "Say something about mixtures of experts."}]


def running(httpx: object, engine: str) -> float:
    import httpx as hx

    text = hx.get(engine + "/metrics", timeout=5).text
    m = re.search(r"^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else -1.0


def chat(gateway: str, key: str, n: int) -> float:
    import httpx

    t0 = time.monotonic()
    r = httpx.post(gateway + "/v1/chat/completions", json={"model": MODEL, "messages": MSG, "max_tokens": n,
                                                             "ignore_eos": True},
                   headers={"Authorization": f"Bearer {key}"}, timeout=600)
    r.raise_for_status()
    return time.monotonic() - t0


class SlowReader:
    """A raw client that asks for a long stream and takes `chunk` bytes every `every_s` s, `reads` times, then
    nothing; `cut_at`: when its connection was closed or reset by the gateway."""

    def __init__(self, port: int, key: str, n: int, chunk: int, every_s: float, reads: int):
        body = json.dumps({"model": MODEL, "messages": MSG, "max_tokens": n, "stream": True,
                           "ignore_eos": True}).encode()
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode() +
                          b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
                          b"\r\n\r\n" + body)
        self.chunk, self.every_s, self.reads = chunk, every_s, reads
        self.last_read = self.cut_at = 0.0
        self.got = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for _ in range(self.reads):
                data = self.sock.recv(self.chunk)
                if not data:
                    break
                self.got += len(data)
                self.last_read = time.monotonic()
                time.sleep(self.every_s)
            while self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0] != 7:  # 7: TCP_CLOSE (reset)
                time.sleep(0.05)  # reads nothing more; a reset leaves unread data readable, so its state is read
        except OSError:
            pass
        self.cut_at = time.monotonic()


def unread(sock: socket.socket) -> int:
    """Bytes in the socket's receive buffer that its reader has not taken (FIONREAD)."""
    import fcntl
    import struct
    import termios

    out = bytearray(4)
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, out)
    return int(struct.unpack("i", out)[0])


def first_token_s(gateway: str, key: str) -> float:
    import httpx

    t0 = time.monotonic()
    with httpx.stream("POST", gateway + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                      json={"model": MODEL, "messages": MSG, "max_tokens": 3, "stream": True,
                            "chat_template_kwargs": {"thinking": False}}, timeout=900) as r:  # tokens in `content`
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            delta = choices[0].get("delta") or {}
            if delta.get("content") or delta.get("reasoning"):
                return time.monotonic() - t0
        print(f"  (the polite request: HTTP {r.status_code}, no token)")
    return float("nan")


def slow_readers(args: argparse.Namespace) -> None:
    import httpx

    extra = ("--max-tokens", str(args.gateway_max_tokens)) if args.gateway_max_tokens else ()
    kinds = {"byte": ("1 byte/s", 1, 1.0, 10), "burst": (f"64 KiB every {args.burst_every:g} s", 65536, args.burst_every, 3)}
    with gateway_stack("moet-bench-slow-", args.tok_s, 1, ("polite", "slow"), ("--stall-s", str(args.stall_s), *extra)) as st:
        for label, chunk, every, reads in (kinds[k] for k in args.readers.split(",")):
            reader = SlowReader(st.gw_port, st.keys["slow"], args.slow_tokens, chunk, every, reads)
            while running(httpx, st.engine) < 1:
                time.sleep(0.01)
            t0 = time.monotonic()
            wait = first_token_s(st.gateway, st.keys["polite"])
            reader.thread.join(args.slow_tokens / args.tok_s + args.stall_s + reads * every + 30)
            head = (f"slow reader ({label}, {args.slow_tokens} tokens = {args.slow_tokens / args.tok_s:.1f} s of engine "
                    f"time): polite key's first token after {wait:.2f} s; ")
            if reader.cut_at:
                print(head + f"the reader cut {reader.cut_at - reader.last_read:.1f} s after its last read "
                      f"({reader.got} bytes read; cut {reader.cut_at - t0:.1f} s after the polite request; stall "
                      f"{args.stall_s:g} s)")
            else:  # its TCP stack took the whole answer: the gateway holds nothing of it, nothing to cut
                print(head + f"the reader not cut: its TCP stack acknowledged the whole answer ({unread(reader.sock):,} "
                      f"bytes unread in its receive buffer, {reader.got} read), so the gateway held nothing of it")
            reader.sock.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tok-s", type=float, default=48.9)
    ap.add_argument("--greedy", type=int, default=4)
    ap.add_argument("--greedy-tokens", type=int, default=100)
    ap.add_argument("--slow-tokens", type=int, default=4096, help="the slow readers' answers (default: the cap)")
    ap.add_argument("--stall-s", type=float, default=30.0, help="the gateway's --stall-s (default: the documented 30)")
    ap.add_argument("--burst-every", type=float, default=25.0, help="the burst reader's pace, s")
    ap.add_argument("--only-slow", action="store_true", help="only the slow readers' part")
    ap.add_argument("--readers", default="byte,burst", help="which slow readers: byte, burst")
    ap.add_argument("--gateway-max-tokens", type=int, default=0, help="the gateway's --max-tokens (answers past the "
                    "default cap: past the kernel's buffers)")
    args = ap.parse_args()
    import httpx

    if args.only_slow:
        slow_readers(args)
        return 0

    with gateway_stack("moet-bench-fair-", args.tok_s, 1, ("polite", "greedy")) as st:
        engine, gateway, gw_port, keys = st.engine, st.gateway, st.gw_port, st.keys
        body = json.dumps({"model": MODEL, "messages": MSG, "max_tokens": 400, "ignore_eos": True}).encode()
        s = socket.create_connection(("127.0.0.1", gw_port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " +
                  keys["greedy"].encode() + b"\r\nContent-Type: application/json\r\nContent-Length: " +
                  str(len(body)).encode() + b"\r\n\r\n" + body)
        while running(httpx, engine) < 1:
            time.sleep(0.01)
        time.sleep(0.5)  # a few tokens in
        polite: list[float] = []
        t = threading.Thread(target=lambda: polite.append(chat(gateway, keys["polite"], 3)))
        s.close()
        t0 = time.monotonic()
        t.start()
        while running(httpx, engine) > 0:
            time.sleep(0.01)
        freed = time.monotonic() - t0
        t.join(600)
        print(f"abandoned 400-token answer: engine free {freed * 1e3:.0f} ms after the hang-up; another key's "
              f"3-token request answered in {polite[0]:.2f} s")

        ends: list[tuple[str, float]] = []
        lock = threading.Lock()

        def ask(name: str, n: int) -> None:
            chat(gateway, keys[name], n)
            with lock:
                ends.append((name, time.monotonic()))

        greedy = [threading.Thread(target=ask, args=("greedy", args.greedy_tokens)) for _ in range(args.greedy)]
        for g in greedy:
            g.start()
        time.sleep(0.3)  # the greedy requests are queued behind the first
        p0 = time.monotonic()
        p = threading.Thread(target=ask, args=("polite", 3))
        p.start()
        for th in (*greedy, p):
            th.join(600)
        order = [n for n, _ in sorted(ends, key=lambda x: x[1])]
        took = next(e for n, e in ends if n == "polite") - p0
        print(f"turns: {args.greedy} greedy requests of {args.greedy_tokens} tokens, then a polite 3-token one: "
              f"answered in {took:.2f} s, after {order.index('polite')} greedy answer(s) (order {order})")
    slow_readers(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
