"""Benchmark: three SIMULATED boxes, each in its own network namespace, behind the front (vLLM's router + the
moet-panel gateway), driven by the openai SDK (issue 51; docs/fleet.md#the-fault-table).

    .venv/bin/python bench/fleet/run.py [--boxes 3] [--tokens 60] [--tok-s 50] [--loop-s 8]    (root: ip netns)

Prints, in one run: one answer vs 3 at once (goal ≤ 1.2×); throughput through 1 box vs all (goal ≥ 2.7×); usage at
the front vs the boxes' engine counters (goal: equal); a box switching profile while a client loops (goal 0 refused,
0 cut); the same box upgraded to a candidate build and rolled back (the same goal); a box's link cut (longest gap
≤ 5 s; streams on it end with an error, not a hang); a box's gateway frozen (SIGSTOP); a lossy link (20 %); a slow
lossy link (300 ms each way and 20 %: netem, or here a delaying relay and nftables); the router killed (serving again
≤ 10 s); a key revoked at the front (refused ≤ 1 s). Everything it starts is removed at the end, even on failure (bench/fleet/netboxes.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.fleet.netboxes import Fleet  # noqa: E402

MODEL = "deepseek-v4-flash"


@dataclass
class Result:
    start: float
    end: float
    ok: bool  # 200 and the stream ended with a finish_reason
    status: int  # 200, the HTTP error status, or 0: the connection failed
    error: str = ""
    tokens: int = 0


class Client:
    def __init__(self, url: str, key: str, timeout_s: float = 60.0) -> None:
        import openai

        self.sdk = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=timeout_s)

    def ask(self, n: int, prompt: str = "tell me about experts") -> Result:
        import openai

        t = time.monotonic()
        try:
            stream = self.sdk.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=n, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            finished, tokens = False, 0
            for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finished = True
                if chunk.usage is not None:
                    tokens = chunk.usage.completion_tokens
            return Result(t, time.monotonic(), finished, 200, "" if finished else "cut: no finish_reason", tokens)
        except openai.APIStatusError as exc:
            return Result(t, time.monotonic(), False, exc.status_code, str(exc)[:160])
        except (openai.APIError, Exception) as exc:  # a stream ended by an error event, a dropped connection
            return Result(t, time.monotonic(), False, 0, f"{type(exc).__name__}: {str(exc)[:160]}")


def loop(client: Client, n: int, threads: int, during: Callable[[], None], settle_s: float = 1.0) -> list[Result]:
    """`threads` clients call in a loop while `during()` runs (plus `settle_s` after)."""
    stop = threading.Event()
    out: list[Result] = []
    lock = threading.Lock()

    def caller() -> None:
        while not stop.is_set():
            r = client.ask(n)
            with lock:
                out.append(r)

    ths = [threading.Thread(target=caller) for _ in range(threads)]
    for th in ths:
        th.start()
    try:
        during()
        time.sleep(settle_s)
    finally:
        stop.set()
        for th in ths:
            th.join()
    return out


def longest_gap(results: list[Result], since: float) -> float:
    """The longest time after `since` with no successful answer completing."""
    ends = sorted(r.end for r in results if r.ok and r.end >= since)
    last, gap = since, 0.0
    for e in ends:
        gap = max(gap, e - last)
        last = e
    return gap


def summary(rs: list[Result]) -> str:
    refused = [r for r in rs if r.status not in (200,)]
    cut = [r for r in rs if r.status == 200 and not r.ok]
    errs = sorted({f"{r.status}: {r.error[:110]}" for r in refused + cut})
    return f"{len(rs)} requests, {len(refused)} refused, {len(cut)} cut{f' {errs}' if errs else ''}"


def throughput(client: Client, n: int, threads: int, seconds: float) -> tuple[float, str]:
    rs = loop(client, n, threads, lambda: time.sleep(seconds), settle_s=0)
    span = max(r.end for r in rs) - min(r.start for r in rs)
    return sum(r.tokens for r in rs if r.ok) / span, summary(rs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--boxes", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=60)
    ap.add_argument("--tok-s", type=float, default=50.0, help="each SIMULATED engine's decode rate")
    ap.add_argument("--loop-s", type=float, default=8.0, help="each throughput side's seconds")
    args = ap.parse_args()
    t0 = time.monotonic()
    with Fleet(args.boxes, decode_tok_s=args.tok_s, relays=True) as f:  # relays: the slow link's delay (no netem)
        f.start()
        key = f.cli("keys", "create", "bench").stdout.split()[0]
        print(f"fleet: {args.boxes} boxes in namespaces {[b.ns for b in f.boxes]}, front {f.front_url}, "
              f"serving in {time.monotonic() - t0:.1f} s", flush=True)
        base_tokens = sum(b.command("tokens", "tokens")["tokens"] for b in f.boxes)  # the engines' own checks
        f.enter_front()
        c = Client(f.front_url, key)
        c.ask(4)
        one = min((r.end - r.start) for r in (c.ask(args.tokens) for _ in range(2)))
        res: list[Result] = []
        ths = [threading.Thread(target=lambda: res.append(c.ask(args.tokens))) for _ in range(args.boxes)]
        t = time.monotonic()
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        together = time.monotonic() - t
        print(f"one answer of {args.tokens} tokens: {one:.2f} s; {args.boxes} at once: {together:.2f} s = "
              f"{together / one:.2f}x (goal ≤ 1.2x); {summary(res)}", flush=True)

        # throughput: every box, then one box (the others removed from the router without a restart), side by side
        all_tps, all_sum = throughput(c, args.tokens, 2 * args.boxes, args.loop_s)
        for b in f.boxes[1:]:
            f.cli("fleet", "remove", b.name)
        time.sleep(2)  # the front's view of the boxes (1 s) follows the fleet file
        one_tps, one_sum = throughput(c, args.tokens, 2 * args.boxes, args.loop_s)
        for b in f.boxes[1:]:
            f.cli("fleet", "add", b.name, b.url)
        print(f"throughput: 1 box {one_tps:.0f} tok/s, {args.boxes} boxes {all_tps:.0f} tok/s = "
              f"{all_tps / one_tps:.2f}x (goal ≥ {0.9 * args.boxes:.1f}x); 1 box: {one_sum}; all: {all_sum}", flush=True)
        time.sleep(3)

        # usage at the front = the boxes' engine counters (everything so far went through the front)
        counted = [b.command("tokens", "tokens") for b in f.boxes]
        engine_total = sum(d["tokens"] for d in counted) - base_tokens
        boxes_gw = sum(d["gateway"] for d in counted)
        import json as _json

        time.sleep(1.5)  # the front writes usage once a second
        usage = _json.loads(f.cli("keys", "list", "--json").stdout)
        front_total = sum(k["completion_tokens"] for k in usage)
        print(f"usage: front {front_total} completion tokens (all keys); the boxes' gateways billed the fleet key "
              f"{boxes_gw}; the boxes' engines generated {engine_total:.0f} (the difference: the engines' own "
              f"1-token canaries while idle, engine/canary.py) -> front {'=' if front_total == boxes_gw else '≠'} "
              "boxes", flush=True)

        # a box switches profile while clients loop
        b1 = f.boxes[0]
        t = time.monotonic()
        rs = loop(c, 20, 3, lambda: b1.command("switch balanced", "switched"))
        print(f"box {b1.name} switched to balanced in {time.monotonic() - t:.1f} s while clients looped: "
              f"{summary(rs)} (goal 0 refused, 0 cut)", flush=True)

        # the same box upgraded to the SIMULATED candidate build `next` (build + promote, as its owner does), then
        # rolled back, while clients loop
        time.sleep(4)  # the box back in the router's rotation
        for cmd in ("upgrade next", "rollback"):
            done: dict[str, object] = {}
            rs = loop(c, 20, 3, lambda cmd=cmd, done=done: done.update(b1.command(cmd, "upgraded")))
            print(f"box {b1.name} {cmd}: build {done.get('previous')} -> {done.get('upgraded')} in "
                  f"{done.get('seconds')} s while clients looped: {summary(rs)} (goal 0 refused, 0 cut)", flush=True)
            time.sleep(4)

        # faults: link cut, frozen gateway, lossy link, slow lossy link
        b2, b3 = f.boxes[1], f.boxes[2 % args.boxes]
        for name, on, off in (
                ("link cut", lambda: f.link(b2, False), lambda: f.link(b2, True)),
                ("gateway frozen (SIGSTOP)", lambda: f.freeze(b3, True), lambda: f.freeze(b3, False)),
                ("lossy link", lambda: print(f"  applied: {f.netem(b2, True)}"), lambda: f.netem(b2, False)),
                ("slow lossy link", lambda: print(f"  applied: {f.slow_link(b2, True)}"),
                 lambda: print(f"  {f.slow_link(b2, False) or 'removed'}; the relay carried {b2.relayed}"))):
            mark = [0.0]

            def during(on: Callable[[], None] = on, mark: list[float] = mark) -> None:
                time.sleep(2)
                mark[0] = time.monotonic()
                on()
                time.sleep(12)

            hit = b2 if name != "gateway frozen (SIGSTOP)" else None
            billed0 = hit.command("tokens", "tokens")["gateway"] if hit else 0
            try:
                rs = loop(c, 20, 3, during)
            finally:
                off()
            on_box = ""
            if hit:  # what the faulted box's gateway billed the fleet key meanwhile: the answers it served
                on_box = (f"; {hit.name} served {(hit.command('tokens', 'tokens')['gateway'] - billed0) / 20:.0f} "
                          "of the loop's answers (its first 2 s before the fault)")
            after = [r for r in rs if r.start >= mark[0]]
            hung = max((r.end - r.start for r in rs if not r.ok), default=0.0)
            print(f"{name}: longest gap with no answer after it {longest_gap(rs, mark[0]):.2f} s (goal ≤ 5 s); "
                  f"after it {summary(after)}; all {summary(rs)}{on_box}; longest failed request {hung:.1f} s; "
                  f"longest request {max(r.end - r.start for r in rs):.1f} s", flush=True)
            time.sleep(4)  # the box back in the router's rotation

        # the router killed: the front's supervisor restarts it
        pid = f.router_pid()
        pids = [pid] if pid else []
        t = time.monotonic()
        for p in pids:
            os.kill(p, 9)
        back = None
        while time.monotonic() - t < 60:
            r = c.ask(4)
            if r.ok and f.router_pid() != pid:
                back = time.monotonic() - t
                break
            time.sleep(0.1)
        print(f"router killed (pid {pids}): serving again after {back if back is None else round(back, 2)} s "
              "(goal ≤ 10 s)", flush=True)

        # a key revoked at the front
        k2 = f.cli("keys", "create", "revoke-me").stdout.split()[0]
        c2 = Client(f.front_url, k2)
        first = c2.ask(4)
        if not first.ok:  # printed, not hidden: the new key's first answer failed (e.g. right after the router's restart)
            print(f"  the new key's first request failed: {first.status} {first.error}", flush=True)
            end = time.monotonic() + 10
            while not c2.ask(4).ok:
                assert time.monotonic() < end, "the new key is not served within 10 s"
        done = threading.Event()
        t_rev: list[float] = []

        def revoke() -> None:
            f.cli("keys", "revoke", "revoke-me")
            t_rev.append(time.monotonic())
            done.set()

        threading.Thread(target=revoke).start()
        done.wait(60)
        refused_after = None
        while time.monotonic() - t_rev[0] < 10:
            r = c2.ask(2)
            if r.status == 401:
                refused_after = max(0.0, r.end - t_rev[0])
                break
        print(f"key revoked at the front: refused {refused_after if refused_after is None else round(refused_after, 2)} s "
              "after the revoke command returned (goal ≤ 1 s)", flush=True)
    print(f"bench took {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
