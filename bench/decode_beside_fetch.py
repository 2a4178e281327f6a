"""How fast one artifact's extraction runs alone, beside fetch threads in its process, and beside
the same fetch threads in another process; and the three artifacts extracted at once from local
parts, the panel's extractor against the card's `zstd -d | tar -x` (docs/downloads.md, "The GIL's
switch interval").

The question it answers: during a capped download the store's decoder runs at about half the rate
it reaches once the fetch is over. If the cause is the GIL the decoder shares with the fetch
workers' libcurl callbacks, moving the extraction into its own process removes it; if it is the
machine (memory bandwidth, the sandbox's syscalls), it does not.

    bench/decode_beside_fetch.py [--work DIR] [--gib 4.5] [--rounds 2] [--fetchers 8] [--link-mbps 1000]
                                 [--modes alone,threads:5,threads:0.5,process] [--no-all-at-once]

The store's parts come from bench/download's cached data set (built if missing). The fetchers
pull the other artifacts' parts from the SIMULATED hub, 50 MB/s per connection and 1 GB/s in all,
in 16 MiB ranges (as the panel does), write them to a scratch file and hash them.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import app.backend.download.extract as extract_mod  # noqa: E402
from app.backend.download.extract import ExtractHooks, extract_stream  # noqa: E402
from app.backend.download.chain import map_range  # noqa: E402
from app.backend.download.ranged import RangeGetter  # noqa: E402
from app.backend.simhub.server import SimHub  # noqa: E402
from download_bench import REPO, build  # noqa: E402

MiB, GiB, MB = 1 << 20, 1 << 30, 1_000_000
RANGE = 16 * MiB
SHIPPED_DECODE_CHUNK = extract_mod.DECODE_CHUNK


class Parts:
    """The parts as one stream of in-place views, as the panel's _PartChain hands them out."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths, self.idx, self.off, self.fd = paths, 0, 0, -1

    def read(self, size: int = -1) -> Any:
        while self.idx < len(self.paths):
            if self.fd < 0:
                self.fd, self.off = os.open(self.paths[self.idx], os.O_RDONLY), 0
            left = os.fstat(self.fd).st_size - self.off
            if left:
                n = left if size < 0 else min(size, left)
                self.off += n
                return map_range(self.fd, self.off - n, self.off)
            os.close(self.fd)
            self.fd, self.idx = -1, self.idx + 1
        return b""


def fetchers(urls: list[tuple[str, int]], count: int, scratch: Path, stop: Any, fetched: Any) -> None:
    """`count` threads, each GETting 16 MiB ranges of the urls in turn until `stop` is set."""
    def one(i: int) -> None:
        getter = RangeGetter(5.0, 30.0)
        fd = os.open(scratch / f"fetch-{i}", os.O_RDWR | os.O_CREAT, 0o644)
        k = i
        try:
            while not stop.is_set():
                url, size = urls[k % len(urls)]
                start = (k * RANGE) % max(size - RANGE, 1)
                h, pos = hashlib.sha256(), [start]

                def body(_reply: Any, piece: memoryview, h: Any = h, pos: list[int] = pos) -> None:
                    os.pwrite(fd, piece, pos[0])
                    h.update(piece)
                    pos[0] += len(piece)

                getter.get(url, {"Range": f"bytes={start}-{start + RANGE - 1}"}, body, stop.is_set)
                with fetched.get_lock():
                    fetched.value += pos[0] - start
                k += count
        finally:
            os.close(fd)
            getter.close()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def extract(parts: list[Path], dest: Path) -> float:
    shutil.rmtree(dest, ignore_errors=True)
    hooks = ExtractHooks(on_bytes=lambda n: None, on_file=lambda name, size, path: None,
                         on_skip=lambda name, size: None, stop=threading.Event())
    t = time.monotonic()
    extract_stream(Parts(parts), dest, {}, hooks)  # type: ignore[arg-type]
    return time.monotonic() - t


def _extract_in_child(parts: list[Path], dest: Path, ready: Any, go: Any, out: Any) -> None:
    ready.release()  # imported (the spawned child runs this module's imports before it gets here)
    go.wait()
    out.put((parts[0].name.split(".")[0], extract(parts, dest), time.monotonic()))


def all_at_once(arts: dict[str, list[Path]], work: Path, card: bool) -> tuple[dict[str, float], float, float]:
    """The three artifacts extracted at once from local parts, no network: the panel's extractor, one
    process each, or the card's `zstd -d | tar -x --sparse`. (seconds per artifact, wall, wall to `sync`)."""
    ctx = multiprocessing.get_context("spawn")
    dests = {a: work / f"probe-all-{a}" for a in arts}
    for d in dests.values():
        shutil.rmtree(d, ignore_errors=True)
    os.sync()
    per: dict[str, float] = {}
    if card:
        t = time.monotonic()
        procs = []
        for a, parts in arts.items():
            dests[a].mkdir()
            procs.append((a, subprocess.Popen(f"cat {' '.join(map(str, parts))} | zstd -dq | tar -x --sparse -C {dests[a]}",
                                              shell=True, executable="/bin/bash")))
        while procs:  # whichever ends first
            for a, p in list(procs):
                if p.poll() is not None:
                    per[a] = time.monotonic() - t
                    procs.remove((a, p))
            time.sleep(0.005)
    else:
        ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
        children = [ctx.Process(target=_extract_in_child, args=(parts, dests[a], ready, go, out))
                    for a, parts in arts.items()]
        for c in children:
            c.start()
        for _ in children:  # the clock starts once every child has imported
            ready.acquire(timeout=60)
        t = time.monotonic()
        go.set()
        for _ in children:
            a, _secs, ended = out.get(timeout=300)
            per[a] = ended - t
        for c in children:
            c.join()
    wall = time.monotonic() - t
    os.sync()
    synced = time.monotonic() - t
    for d in dests.values():
        shutil.rmtree(d, ignore_errors=True)
    return per, wall, synced


@dataclass(frozen=True)
class Mode:
    fetch: str = ""  # "", "threads" (in the extracting process) or "process" (another one)
    switch_ms: float = 5.0  # the extracting process's GIL switch interval (CPython's default: 5 ms)
    decode_mib: int = 0  # extract.DECODE_CHUNK for this run, 0: as shipped

    def __str__(self) -> str:
        if not self.fetch:
            return "alone"
        where = "threads" if self.fetch == "threads" else "process (another one)"
        extra = f", {self.decode_mib} MiB buffers" if self.decode_mib else ""
        return f"beside fetch {where}, switch {self.switch_ms:g} ms{extra}"


def parse_mode(text: str) -> Mode:
    """alone | threads:<switch ms>[:<decode MiB>] | process"""
    kind, *rest = text.split(":")
    if kind == "alone":
        return Mode()
    return Mode(kind, float(rest[0]) if rest else 5.0, int(rest[1]) if len(rest) > 1 else 0)


def one_run(mode: Mode, parts: list[Path], urls: list[tuple[str, int]], n: int, work: Path) -> tuple[float, float]:
    """(extraction seconds, fetch MB/s meanwhile)."""
    ctx = multiprocessing.get_context("spawn")
    stop, fetched = ctx.Event(), ctx.Value("q", 0)
    scratch = work / "probe-scratch"
    scratch.mkdir(exist_ok=True)
    side: Any = None
    sys.setswitchinterval(mode.switch_ms / 1000)
    extract_mod.DECODE_CHUNK = (mode.decode_mib << 20) or SHIPPED_DECODE_CHUNK
    if mode.fetch == "threads":
        side = threading.Thread(target=fetchers, args=(urls, n, scratch, stop, fetched), daemon=True)
    elif mode.fetch == "process":
        side = ctx.Process(target=fetchers, args=(urls, n, scratch, stop, fetched), daemon=True)
    if side is not None:
        side.start()
        deadline = time.monotonic() + 10
        while fetched.value < 64 * MiB and time.monotonic() < deadline:  # fetching at full rate first
            time.sleep(0.01)
    f0, t1 = fetched.value, time.monotonic()
    wall = extract(parts, work / "probe-dest")
    rate = (fetched.value - f0) / (time.monotonic() - t1) / MB
    stop.set()
    if side is not None:
        side.join(timeout=60)
    shutil.rmtree(work / "probe-dest", ignore_errors=True)
    return wall, rate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="/var/tmp/moet-panel-bench3")
    ap.add_argument("--gib", type=float, default=4.5)
    ap.add_argument("--part-mib", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fetchers", type=int, default=8, help="fetch connections beside the extraction")
    ap.add_argument("--link-mbps", type=float, default=1000, help="the hub's link cap (0: none)")
    ap.add_argument("--modes", default="alone,threads:5,threads:0.5,process",
                    help="comma-separated: alone | threads:<switch ms>[:<decoded buffer MiB>] | process")
    ap.add_argument("--no-all-at-once", action="store_true", help="skip the three-at-once extraction")
    args = ap.parse_args()
    work = Path(args.work)
    arts = build(work, args.gib, args.part_mib, "weights")
    store = arts["store"]
    compressed = sum(p.stat().st_size for p in store)
    for p in store:  # in the page cache, as a just-fetched part is
        with open(p, "rb") as f:
            while f.read(8 * MiB):
                pass
    hub = SimHub(rate_cap_bps=50 * MB, link_cap_bps=args.link_mbps * MB or None)
    commit = hub.add_repo(REPO, {p.name: p for parts in arts.values() for p in parts}).commit
    modes = [parse_mode(m) for m in args.modes.split(",")]
    results: dict[Mode, list[tuple[float, float]]] = {m: [] for m in modes}
    with hub.start():
        urls = [(f"{hub.cdn_endpoint}/cdn/{REPO}/{commit}/{p.name}", p.stat().st_size)
                for a in ("model", "planescache") for p in arts[a]]
        for r in range(args.rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                wall, rate = one_run(mode, store, urls, args.fetchers, work)
                results[mode].append((wall, rate))
                print(f"  round {r + 1} {mode!s:48s} {wall:6.2f} s  {compressed / wall / GiB:5.2f} GiB/s compressed"
                      f"  fetch {rate:5.0f} MB/s", flush=True)
        for r in range(0 if args.no_all_at_once else args.rounds):
            for card in (False, True) if r % 2 == 0 else (True, False):
                per, wall, synced = all_at_once(arts, work, card)
                name = "card zstd | tar" if card else "panel extractor"
                print(f"  round {r + 1} all three at once, {name}: " + ", ".join(f"{a} {t:.2f} s" for a, t in per.items())
                      + f"; all {wall:.2f} s, to sync {synced:.2f} s", flush=True)
    shutil.rmtree(work / "probe-scratch", ignore_errors=True)
    print(f"\nstore: {compressed / GiB:.2f} GiB compressed, {os.cpu_count()} CPUs, {args.fetchers} fetch connections "
          f"(50 MB/s each, {f'{args.link_mbps:g} MB/s link' if args.link_mbps else 'no link cap'}); "
          f"medians of {args.rounds}")
    alone = statistics.median(w for w, _ in results.get(Mode(), [(float("nan"), 0.0)]))
    for mode in modes:
        wall = statistics.median(w for w, _ in results[mode])
        rate = statistics.median(f for _, f in results[mode])
        print(f"| {mode} | {wall:.2f} s | {compressed / wall / GiB:.2f} GiB/s | {alone / wall:.2f}× of alone |"
              + (f" fetch {rate:.0f} MB/s |" if mode.fetch else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
