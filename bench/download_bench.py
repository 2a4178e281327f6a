"""Physical-limit benchmark: the card's three pipelines in sequence vs `moet-panel download` of all
three artifacts vs the stage limits, on one local Hub-like server (docs/downloads.md, "Measured").

One invocation builds three artifacts in the card's proportions (model : planescache : store ≈
156 : 202 : 339 extracted, weight-like data) with the real CLIs (GNU tar --sparse | zstd | split),
serves them from the SIMULATED hub and, per scenario (unthrottled; 50 MB/s per connection; 50 MB/s
per connection + a 1 GB/s link), runs card and panel interleaved, each timed to `sync`. The limit
is the largest stage limit, each measured or computed here: fetch only (one curl stream of every
part, or compressed bytes ÷ the link/connection caps), the slowest artifact's `zstd -d` alone,
`dd` of the extracted physical bytes to the same disk, and sha256 of every part (one thread per
artifact, as the panel). Figures are printed, never asserted. Run via `bench/download` (--help).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.backend.simhub.artifacts import TreeSpec, build_artifact, generate_tree  # noqa: E402
from app.backend.simhub.server import SimHub  # noqa: E402

REPO = "moet-panel/simulated-cache"
SHARES = {"model": 156, "planescache": 202, "store": 339}  # extracted GiB on the card
MB = 1_000_000
MiB = 1 << 20
GiB = 1 << 30

CARD = r"""
set -euo pipefail
EP="$1"; REPO="$2"; cd "$3"
fetch() {
  for p in $(curl -sfL "$EP/api/models/$REPO/tree/main?recursive=true" \
            | python3 -c 'import json,sys;[print(e["path"]) for e in json.load(sys.stdin) if e["type"]=="file"]' \
            | grep "^$1" | sort); do
    curl -sfL --retry 5 "$EP/$REPO/resolve/main/$p"
  done
}
fetch model       | zstd -d -T4 | tar -x --sparse
fetch planescache | zstd -d -T4 | tar -x --sparse
fetch store       | zstd -d -T4 | tar -x --sparse
sync  # every pipeline is timed until the tree is on disk
"""

CARD_ONE = r"""
set -euo pipefail
EP="$1"; REPO="$2"; cd "$3"; ART="$4"
for p in $(curl -sfL "$EP/api/models/$REPO/tree/main?recursive=true" \
          | python3 -c 'import json,sys;[print(e["path"]) for e in json.load(sys.stdin) if e["type"]=="file"]' \
          | grep "^$ART" | sort); do
  curl -sfL --retry 5 "$EP/$REPO/resolve/main/$p"
done | zstd -d -T4 | tar -x --sparse
sync
"""

FETCH_ONLY = r"""
set -euo pipefail
EP="$1"; REPO="$2"; shift 2
for p in "$@"; do curl -sfL "$EP/$REPO/resolve/main/$p"; done > /dev/null
"""
# N curls at once, each fetching one range (URL RANGE pairs): what the hub and its caps deliver in parallel
FETCH_PARALLEL = r"""
set -euo pipefail
N="$1"; shift
printf '%s\n' "$@" | xargs -P "$N" -n 2 sh -c 'curl -sfL -r "$1" "$0" -o /dev/null'
"""
PARALLEL_RANGE = 16 << 20


# ---- data ---------------------------------------------------------------------------------------
def build(work: Path, gib: float, part_mib: int, data: str) -> dict[str, list[Path]]:
    """Three artifacts whose extracted sizes follow SHARES; cached under work/."""
    marker = work / f".built-{gib}-{part_mib}-{data}"
    repo = work / "repo"
    arts = {a: sorted(repo.glob(f"{a}.tar.zst.part.*")) for a in SHARES}
    if marker.exists():
        return arts
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t = time.monotonic()
    per_file = 32 * MiB if gib < 8 else 128 * MiB
    total_share = sum(SHARES.values())
    for i, (art, share) in enumerate(SHARES.items()):
        layers = max(1, round(gib * GiB * share / total_share / per_file / 6))
        generate_tree(work / "src", TreeSpec(top=art, layers=layers, file_size=per_file,
                                             sparse_size=(1 * GiB if art == "store" else 0), sparse_extents=8,
                                             ckpt_id="bench" if art == "planescache" else None, seed=3 + i,
                                             weights_like=(data == "weights")))
        build_artifact(work / "src", art, repo, f"{art}.tar.zst.part.", part_mib * MiB)
        shutil.rmtree(work / "src" / art)
    marker.touch()
    arts = {a: sorted(repo.glob(f"{a}.tar.zst.part.*")) for a in SHARES}
    print(f"built {sum(len(p) for p in arts.values())} parts, {compressed(arts) / GiB:.2f} GiB compressed, "
          f"in {time.monotonic() - t:.0f} s", flush=True)
    return arts


def compressed(arts: dict[str, list[Path]]) -> int:
    return sum(p.stat().st_size for parts in arts.values() for p in parts)


def reference(work: Path, arts: dict[str, list[Path]]) -> dict[str, tuple[int, int, int]]:
    """Per artifact: (files, apparent bytes, physical bytes) of a reference `tar -x --sparse`."""
    ref = work / "ref-count"
    if not ref.exists():
        probe = work / "probe"
        lines = []
        for art, parts in arts.items():
            shutil.rmtree(probe, ignore_errors=True)
            probe.mkdir()
            subprocess.run(f"cat {' '.join(map(str, parts))} | zstd -dq | tar -x --sparse -C {probe}", shell=True,
                           check=True, executable="/bin/bash")
            files = [f for f in (probe / art).rglob("*") if f.is_file()]
            lines.append(f"{art} {len(files)} {sum(f.stat().st_size for f in files)} "
                         f"{sum(f.stat().st_blocks * 512 for f in files)}")
        shutil.rmtree(probe, ignore_errors=True)
        ref.write_text("\n".join(lines))
    out = {}
    for line in ref.read_text().splitlines():
        art, n, size, phys = line.split()
        out[art] = (int(n), int(size), int(phys))
    return out


def check_trees(dest: Path, expect: dict[str, tuple[int, int, int]]) -> str:
    bad = []
    for art, (n, size, _) in expect.items():
        files = [f for f in (dest / art).rglob("*") if f.is_file()]
        if len(files) != n or sum(f.stat().st_size for f in files) != size:
            bad.append(f"{art}: {len(files)} files, {sum(f.stat().st_size for f in files)} bytes")
    return "ok" if not bad else "MISMATCH " + "; ".join(bad)


# ---- timing -------------------------------------------------------------------------------------
@dataclass
class Run:
    wall: float
    rc: int
    cpu: float  # user + sys of the whole process tree
    rss_kib: int  # peak of the tree's summed RSS (the panel's artifact processes together), or wait4's peak
    pss_kib: int = 0  # peak of the tree's summed PSS: shared pages (the forkserver's imports) counted once in all
    staging: int = 0  # panel only: the peak staging it reported
    dirty: list[float] = field(default_factory=list)  # GiB of dirty + writeback pages, every DIRTY_EVERY_S
    at_peak: str = ""  # each process's PSS (anonymous + file) when the tree's PSS peaked


DIRTY_EVERY_S = 0.5
TREE_EVERY_S = 0.05


class TreeSampler:
    """Summed RSS and CPU of the processes below the timed one that it does not wait for.

    wait4() covers the timed process and the ones it reaped; the panel's artifact processes come
    from a multiprocessing forkserver nobody waits for, so their RSS and CPU are sampled here (the
    last ≤ TREE_EVERY_S of each is missed: figures are a lower bound for them).
    """

    def __init__(self, pid: int) -> None:
        import psutil
        self.psutil, self.root = psutil, psutil.Process(pid)
        self.peak_rss, self.peak_pss, self.cpu, self.at_peak = 0, 0, {}, ""  # type: ignore[var-annotated]

    def sample(self) -> None:
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except self.psutil.Error:
            return
        rss, pss, servers, each = 0, 0, set(), []
        for proc in tree:
            try:
                full = proc.memory_full_info()
                rss, pss = rss + full.rss, pss + full.pss
                if "forkserver" in " ".join(proc.cmdline()):  # the server and the children it forked
                    servers.add(proc.pid)
                each.append(proc)
                if proc.pid in servers or proc.ppid() in servers:  # the forkserver and its children: never reaped by us
                    t = proc.cpu_times()
                    self.cpu[proc.pid] = max(self.cpu.get(proc.pid, 0.0), t.user + t.system)
            except self.psutil.Error:
                continue
        self.peak_rss = max(self.peak_rss, rss)
        if pss > self.peak_pss:
            self.peak_pss, self.at_peak = pss, " ".join(_pss_of(self._role(p, servers), p.pid) for p in each)

    def _role(self, proc: Any, servers: set[int]) -> str:
        try:
            ppid = proc.ppid()
        except self.psutil.Error:
            return "gone"
        if proc.pid in servers:
            return "artifact" if ppid in servers else "forkserver"
        return "root" if proc.pid == self.root.pid else "process"


def _pss_of(role: str, pid: int) -> str:
    """`role anon+file` in MiB from smaps_rollup (Pss_Anon, Pss_File: what the process has to itself
    and its share of mapped files, e.g. imported code and the staged parts it reads in place)."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    except OSError:
        return f"{role} ?"
    anon, file = (int(fields.get(k, "0 kB").split()[0]) >> 10 for k in ("Pss_Anon", "Pss_File"))
    return f"{role} {anon}+{file}"


def _dirty_gib() -> float:
    """Page cache not yet on disk (Dirty + Writeback of /proc/meminfo): what the final `sync` still waits for."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    except OSError:
        return 0.0
    return sum(int(fields.get(k, "0 kB").split()[0]) for k in ("Dirty", "Writeback")) / (1 << 20)


def timed(cmd: list[str], env: dict | None = None, cwd: Path = ROOT) -> tuple[Run, str]:
    subprocess.run(["sync"], check=False)
    t = time.monotonic()
    p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dirty: list[float] = []
    done = threading.Event()
    tree = TreeSampler(p.pid)

    def sample() -> None:
        ticks = 0
        while not done.wait(TREE_EVERY_S):
            tree.sample()
            ticks += 1
            if ticks % round(DIRTY_EVERY_S / TREE_EVERY_S) == 0:
                dirty.append(_dirty_gib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    _, status, usage = os.wait4(p.pid, 0)
    elapsed = time.monotonic() - t
    done.set()
    sampler.join()
    rc = os.waitstatus_to_exitcode(status)
    if rc != 0:
        print(f"  ! {cmd[0]} exited {rc}: {err.strip()[-400:]}", flush=True)
    unreaped_cpu = sum(tree.cpu.values())
    return Run(elapsed, rc, usage.ru_utime + usage.ru_stime + unreaped_cpu, max(usage.ru_maxrss, tree.peak_rss // 1024),
               pss_kib=tree.peak_pss // 1024, dirty=dirty, at_peak=tree.at_peak), err


def worktree(work: Path, rev: str) -> Path:
    """The panel at `rev`, checked out beside the work data (a detached git worktree, made once per commit).

    `rev` may also be a directory holding another commit's tree (`git archive REV | tar -x -C DIR`):
    the device machine gets a copy of the working tree without its git history."""
    if (Path(rev) / "app").is_dir():
        print(f"baseline: the tree in {rev}", flush=True)
        return Path(rev).resolve()
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    path = work / f"baseline-{commit[:12]}"
    if not (path / "app").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", "--force", str(path), commit], cwd=ROOT, check=True,
                       capture_output=True)
    print(f"baseline: {rev} = {commit[:12]} in {path}", flush=True)
    return path


def waits_lines(err: str) -> str:
    """The panel's own account of where its extractors waited (its last stderr lines)."""
    return "".join(f"    {line.strip()}\n" for line in err.splitlines() if "extractor waited" in line)


# py-spy: all threads with idle time and native frames, then only the thread holding the GIL
SPY_MODES = (["--idle", "--threads", "--native"], ["--gil"])


def _last_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("timeline", "series"))]
    return lines[-1].strip()[:300] if lines else "(no output)"


def timeline_lines(err: str) -> str:
    """--timeline: bench/download_timeline.py's lines (when each stage began and ended)."""
    return "".join(f"    {line.strip()}\n" for line in err.splitlines() if line.startswith(("timeline", "series")))


Body = tuple[str, int, int, float, float]  # (path, first byte, bytes sent, began, ended: time.monotonic())
Seen = tuple[float, str, str]  # (arrived, method, path)


def _serve_hub(conn: Connection, files: dict[str, Path], conn_cap: float | None, link_cap: float | None) -> None:
    hub = SimHub(rate_cap_bps=conn_cap, link_cap_bps=link_cap)
    hub.add_repo(REPO, files)
    with hub.start():
        conn.send(hub.endpoint)
        while (ask := conn.recv()) != "stop":
            with hub.stats.lock:
                conn.send((list(hub.stats.bodies), list(hub.stats.seen)))
                if ask == "take":
                    hub.stats.bodies.clear()
                    hub.stats.seen.clear()


class HubProcess:
    """The SIMULATED hub in a process of its own, as a real Hub is to its clients: its sender threads (one
    per connection, pacing every ~250 KB) no longer share a GIL with the bench's tree sampler, which parses
    every process's /proc files every 50 ms (measured on 16 cores: 24 curls 4.19-4.47 s capped + link,
    against 4.21-5.06 s in the bench's process: no clear change, docs/downloads.md "Fifteenth session")."""

    def __init__(self, files: dict[str, Path], conn_cap: float | None = None, link_cap: float | None = None) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_serve_hub, args=(theirs, files, conn_cap, link_cap), daemon=True)
        self._proc.start()
        theirs.close()
        self.endpoint: str = self._conn.recv()

    def take(self) -> tuple[list[Body], list[Seen]]:
        """What it served and saw since the last take (and forget it)."""
        self._conn.send("take")
        return self._conn.recv()

    def __enter__(self) -> HubProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self._conn.send("stop")
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()


def fetch_lines(bodies: list[Body], began: float, arts: dict[str, list[Path]]) -> str:
    """--series: when the hub served each part's ranges, from the run's start: first range began - last
    range ended, and the slowest range's seconds (is a part late because its ranges began late, or
    because one of them was slow?)."""
    out = ""
    for art, parts in arts.items():
        cells = []
        for i, p in enumerate(parts):
            mine = [b for b in bodies if b[0] == p.name]
            if mine:
                cells.append(f"{i}:{min(b[3] for b in mine) - began:.2f}-{max(b[4] for b in mine) - began:.2f}"
                             f"/{max(b[4] - b[3] for b in mine):.2f}")
        out += f"    ranges {art} (part: first began-last ended/slowest s): " + " ".join(cells) + "\n"
    largest = max(arts, key=lambda a: sum(p.stat().st_size for p in arts[a]))
    for i, p in enumerate(arts[largest][:4]):  # the largest artifact's first parts, range by range
        mine = sorted((b for b in bodies if b[0] == p.name), key=lambda b: b[1])
        out += f"    ranges {largest} part {i} (began-ended s): " + " ".join(
            f"{b[3] - began:.2f}-{b[4] - began:.2f}" for b in mine) + "\n"
    return out


LINK_BIN_S = 0.05


def link_line(bodies: list[Body], began: float, cap_bps: float) -> str:
    """Where the capped link went unused, from the hub's record of each body served (each body's bytes
    spread evenly over its time, in 50 ms bins): the head (first byte served until the link first ran
    at 90 % of its cap), the middle, and the tail (after the last bin at 90 %); each as seconds of the
    link lost (the sum of 1 - served/cap over its bins). What the start and the end of a run cost."""
    if not bodies:
        return ""
    first, last = min(b[3] for b in bodies) - began, max(b[4] for b in bodies) - began
    bins = [0.0] * (int(last / LINK_BIN_S) + 1)
    for _, _, n, b0, b1 in bodies:
        t0, t1 = b0 - began, max(b1 - began, b0 - began + 1e-6)
        for i in range(int(t0 / LINK_BIN_S), int(t1 / LINK_BIN_S) + 1):
            lo, hi = max(t0, i * LINK_BIN_S), min(t1, (i + 1) * LINK_BIN_S)
            if hi > lo:
                bins[i] += n * (hi - lo) / (t1 - t0)
    full = cap_bps * LINK_BIN_S
    busy = [i for i, x in enumerate(bins) if x >= 0.9 * full]
    if not busy:
        return f"    link: never at 90 % of its cap; first byte {first:.2f} s, last {last:.2f} s\n"
    a, z = busy[0], busy[-1]
    def lost(lo: int, hi: int) -> float:
        return sum(max(0.0, 1 - bins[i] / full) for i in range(lo, hi)) * LINK_BIN_S
    served = sum(bins)
    return (f"    link (cap {cap_bps / MB:.0f} MB/s): first byte {first:.2f} s, at 90 % from {a * LINK_BIN_S:.2f} s"
            f" to {(z + 1) * LINK_BIN_S:.2f} s, last byte {last:.2f} s; {served / GiB:.2f} GiB at"
            f" {served / (last - first) / MB:.0f} MB/s; lost: before the first byte {first:.2f} s, head"
            f" {lost(int(first / LINK_BIN_S), a):.2f} s, middle {lost(a, z + 1):.2f} s, tail {lost(z + 1, len(bins)):.2f} s\n")


def start_line(seen: list[Seen], bodies: list[Body], began: float, arts: dict[str, list[Path]]) -> str:
    """When the panel's start-up steps reached the hub, from the run's start: the listing, the first
    HEAD, and each artifact's first ranged body (what the link waits for before its first byte)."""
    def first(method: str, word: str) -> str:
        t = min((at for at, m, path in seen if m == method and word in path), default=None)
        return "-" if t is None else f"{t - began:.2f}"
    firsts = []
    for art, parts in arts.items():
        names = {p.name for p in parts}
        t = min((b[3] for b in bodies if b[0] in names), default=None)
        firsts.append(f"{art} {'-' if t is None else f'{t - began:.2f}'}")
    return (f"    hub saw (s from start): listing {first('GET', '/api/models/')}, first HEAD {first('HEAD', '/resolve/')},"
            f" first body: {', '.join(firsts)}\n")


def verdict(panel: list[float], base: list[float]) -> str:
    """How many (panel round, baseline round) pairs the panel won: on the 16-core host one machine's
    rounds of the same code spread ±10 %, so a ratio of medians alone reads noise as a change
    (docs/downloads.md, "Fifteenth session"). A verdict only when one side won every pair."""
    wins = sum(p < b for p in panel for b in base)
    pairs = len(panel) * len(base)
    said = "faster in every pair" if wins == pairs else "slower in every pair" if wins == 0 else "no verdict"
    return f"the panel won {wins} of {pairs} round pairs: {said}"


def dirty_line(r: Run) -> str:
    line = f"    dirty GiB every {DIRTY_EVERY_S:g} s: " + " ".join(f"{d:.1f}" for d in r.dirty)
    return line + (f"\n    PSS MiB at the peak (anonymous+file): {r.at_peak}" if r.at_peak else "")


@dataclass
class Scenario:
    name: str
    conn_cap: float | None
    link_cap: float | None
    card: list[Run] = field(default_factory=list)
    panel: list[Run] = field(default_factory=list)
    panel1: list[Run] = field(default_factory=list)  # the panel with one artifact at a time (as before)
    base: list[Run] = field(default_factory=list)  # --baseline: the panel of another commit, same runs
    connections: int = 8
    fetch_limit: float = 0.0
    fetch_how: str = ""
    fetch_measured: float = 0.0  # capped scenarios: parallel curls through the same hub


def run_scenario(sc: Scenario, arts: dict[str, list[Path]], work: Path, runs: int, panel_args: list[str],
                 expect: dict[str, tuple[int, int, int]], conns: int, card_runs_capped: int,
                 sequential: bool, baseline: Path | None = None, entry: tuple[str, ...] = ("-m", "app.cli.main"),
                 profile: Path | None = None) -> None:
    sc.connections = conns
    hub = HubProcess({p.name: p for parts in arts.values() for p in parts}, sc.conn_cap, sc.link_cap)
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("HF_TOKEN", None)
    python = os.environ.get("BENCH_PYTHON", str(ROOT / ".venv/bin/python"))
    def panel(dest: Path) -> list[str]:
        return [python, *entry, "download", "--recipe", str(work / "bench-recipe.toml"), "--dest", str(dest),
                "--endpoint", hub.endpoint, "--connections", str(conns), *panel_args]

    with hub:
        print(f"== {sc.name}", flush=True)
        total = compressed(arts)
        if sc.conn_cap is None and sc.link_cap is None:
            names = [p.name for parts in arts.values() for p in parts]
            r, _ = timed(["bash", "-c", FETCH_ONLY, "fetch", hub.endpoint, REPO, *names], env)
            sc.fetch_limit, sc.fetch_how = r.wall, "one curl stream of every part"
        else:
            rate = min(x for x in (sc.link_cap, (sc.conn_cap or 0) * conns or None) if x)
            sc.fetch_limit = total / rate
            sc.fetch_how = f"{total / GiB:.2f} GiB ÷ {rate / MB:.0f} MB/s"
        print(f"  fetch limit {sc.fetch_limit:6.2f} s  ({sc.fetch_how})", flush=True)
        if sc.conn_cap or sc.link_cap:  # does this hub deliver the computed limit? (it paces in Python)
            pairs = [x for parts in arts.values() for p in parts for start in range(0, p.stat().st_size, PARALLEL_RANGE)
                     for x in (f"{hub.endpoint}/{REPO}/resolve/main/{p.name}",
                               f"{start}-{min(start + PARALLEL_RANGE, p.stat().st_size) - 1}")]
            r, _ = timed(["bash", "-c", FETCH_PARALLEL, "fetch", str(conns), *pairs], env)
            sc.fetch_measured = r.wall
            print(f"  fetch measured {r.wall:6.2f} s  ({conns} curls at once, {PARALLEL_RANGE >> 20} MiB ranges"
                  f"{'' if r.rc == 0 else ', FAILED'})", flush=True)
        for i in range(runs):
            kinds: tuple[str, ...] = ("card", "panel") if i % 2 == 0 else ("panel", "card")
            if sc.conn_cap and i >= card_runs_capped:  # the card on one capped connection: its time is known
                kinds = ("panel",)
            if sequential and not sc.conn_cap:
                kinds += ("panel1",)
            if baseline is not None:  # next to the panel, its order swapped every run like the card's
                at = kinds.index("panel") + (i % 2)
                kinds = kinds[:at] + ("base",) + kinds[at:]
            for kind in kinds:
                dest = work / f"dest-{kind}"
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir()
                if kind == "card":
                    cmd = ["bash", "-c", CARD, "card", hub.endpoint, REPO, str(dest)]
                else:
                    cmd = panel(dest)
                    if kind == "panel1":
                        cmd += ["--artifact-jobs", "1"]
                    cmd = ["bash", "-c", '"$@" && sync', "panel", *cmd]
                root = baseline if kind == "base" and baseline is not None else ROOT
                hub.take()
                began = time.monotonic()
                r, err = timed(cmd, {**env, "PYTHONPATH": env["PYTHONPATH"].replace(str(ROOT), str(root), 1)}, root)
                if kind != "card":
                    m = re.search(r"peak staging disk: .*?\((\d+) bytes\)", err)
                    r.staging = int(m.group(1)) if m else -1
                verdict = check_trees(dest, expect) if r.rc == 0 else "FAILED"
                {"card": sc.card, "panel": sc.panel, "panel1": sc.panel1, "base": sc.base}[kind].append(r)
                print(f"  run {i + 1} {kind:<6} {r.wall:7.2f} s  cpu {r.cpu:6.1f} s  rss {r.rss_kib / 1024:6.1f} MiB"
                      f"  pss {r.pss_kib / 1024:6.1f} MiB"
                      f"{f'  staging peak {r.staging / GiB:.2f} GiB' if kind != 'card' else ''}  tree {verdict}",
                      flush=True)
                if r.rc != 0:  # say why (e.g. the CLI refusing an option), not only FAILED
                    print(f"    rc {r.rc}: {_last_line(err)}", flush=True)
                if i == 0:
                    print(waits_lines(err) + dirty_line(r), flush=True)
                print(timeline_lines(err), end="", flush=True)
                served, seen = hub.take()
                if kind != "card" and (sc.conn_cap or sc.link_cap):
                    cap = min(x for x in (sc.link_cap, (sc.conn_cap or 0) * conns or None) if x)
                    print(link_line(served, began, cap) + start_line(seen, served, began, arts), end="", flush=True)
                if os.environ.get("MOET_TIMELINE_SERIES") and kind != "card":
                    print(fetch_lines(served, began, arts), end="", flush=True)
                shutil.rmtree(dest, ignore_errors=True)
        for spy in (SPY_MODES if profile is not None else []):  # one more panel run per mode, not counted
            assert profile is not None
            profile.mkdir(parents=True, exist_ok=True)
            out = profile / f"{sc.name}-{spy[0].strip('-')}.txt"
            dest = work / "dest-spy"
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            cmd = ["py-spy", "record", "-r", "200", "-f", "raw", "-o", str(out), "--subprocesses", *spy, "--",
                   *panel(dest)]
            r, err = timed(["bash", "-c", '"$@" && sync', "panel", *cmd], env)
            print(f"  py-spy {' '.join(spy):<24} {r.wall:7.2f} s  tree {check_trees(dest, expect) if r.rc == 0 else 'FAILED'}"
                  f"  -> {out}", flush=True)
            print(waits_lines(err) + timeline_lines(err), end="", flush=True)
            shutil.rmtree(dest, ignore_errors=True)


def run_single(art: str, arts: dict[str, list[Path]], work: Path, runs: int, panel_args: list[str],
               expect: dict[str, tuple[int, int, int]], conns: int, profile: Path | None,
               entry: tuple[str, ...] = ("-m", "app.cli.main")) -> None:
    """Unthrottled, one artifact: the card's pipeline for it vs the panel downloading only it.

    With `profile`, one more panel run under py-spy per mode (all threads with idle time, and only
    the thread holding the GIL), written as collapsed stacks for a flame graph.
    """
    hub = HubProcess({p.name: p for parts in arts.values() for p in parts})
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("HF_TOKEN", None)
    python = os.environ.get("BENCH_PYTHON", str(ROOT / ".venv/bin/python"))
    only = {art: expect[art]}
    walls: dict[str, list[Run]] = {"card": [], "panel": []}
    with hub:
        print(f"== one artifact: {art}", flush=True)
        panel = [python, *entry, "download", art, "--recipe", str(work / "bench-recipe.toml"),
                 "--endpoint", hub.endpoint, "--connections", str(conns), *panel_args]
        plan: list[tuple[str, list[str]]] = []
        for i in range(runs):
            pair: list[tuple[str, list[str]]] = [("card", []), ("panel", [])]
            plan += pair if i % 2 == 0 else pair[::-1]
        if profile is not None:
            profile.mkdir(parents=True, exist_ok=True)
            plan += [("py-spy", spy) for spy in SPY_MODES]
        for kind, spy in plan:
            dest = work / "dest-one"
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            if kind == "card":
                cmd = ["bash", "-c", CARD_ONE, "card", hub.endpoint, REPO, str(dest), art]
            else:
                cmd = [*panel, "--dest", str(dest)]
                if kind == "py-spy":
                    out = profile / f"{art}-{spy[0].strip('-')}.txt"  # type: ignore[operator]
                    cmd = ["py-spy", "record", "-r", "200", "-f", "raw", "-o", str(out), *spy, "--", *cmd]
                cmd = ["bash", "-c", '"$@" && sync', "panel", *cmd]
            r, err = timed(cmd, env)
            verdict = check_trees(dest, only) if r.rc == 0 else "FAILED"
            if kind in walls:
                walls[kind].append(r)
            print(f"  {kind:<6} {' '.join(spy):<24} {r.wall:7.2f} s  cpu {r.cpu:6.1f} s  "
                  f"rss {r.rss_kib / 1024:6.1f} MiB  pss {r.pss_kib / 1024:6.1f} MiB  tree {verdict}", flush=True)
            print(waits_lines(err) + timeline_lines(err) + dirty_line(r), flush=True)
            shutil.rmtree(dest, ignore_errors=True)
    card, panel_wall = (statistics.median(r.wall for r in walls[k]) for k in ("card", "panel"))
    print(f"one artifact ({art}): card {card:.2f} s, panel {panel_wall:.2f} s, panel/card {card / panel_wall:.2f}×",
          flush=True)


# ---- stage limits (no network) ------------------------------------------------------------------
def stage_limits(arts: dict[str, list[Path]], work: Path, expect: dict[str, tuple[int, int, int]],
                 rounds: int) -> dict[str, tuple[float, str]]:
    out: dict[str, tuple[float, str]] = {}
    decode = {}
    for art, parts in arts.items():
        best = min(_sh(f"cat {' '.join(map(str, parts))} | zstd -dq -T4 > /dev/null") for _ in range(rounds))
        decode[art] = best
    slowest = max(decode, key=lambda a: decode[a])
    out["decode"] = (decode[slowest], f"zstd -d of {slowest} alone ("
                     + ", ".join(f"{a} {t:.2f} s" for a, t in decode.items()) + ")")
    phys = sum(p for _, _, p in expect.values())
    ddfile = work / "dd.bin"
    dd = min(_sh(f"dd if=/dev/zero of={ddfile} bs=4M count={max(phys // (4 * MiB), 1)} conv=fsync status=none")
             for _ in range(rounds))
    ddfile.unlink(missing_ok=True)
    out["disk"] = (dd, f"dd of {phys / GiB:.2f} GiB physical, fsync")

    def digest(parts: list[Path]) -> None:
        for p in parts:
            h = hashlib.sha256()
            with open(p, "rb") as f:
                while chunk := f.read(8 * MiB):
                    h.update(chunk)

    t = time.monotonic()
    with ThreadPoolExecutor(len(arts)) as pool:
        list(pool.map(digest, arts.values()))
    out["hash"] = (time.monotonic() - t, f"sha256 of {compressed(arts) / GiB:.2f} GiB, one thread per artifact")
    return out


def _sh(script: str) -> float:
    subprocess.run(["sync"], check=False)
    t = time.monotonic()
    subprocess.run(script, shell=True, check=True, executable="/bin/bash")
    return time.monotonic() - t


def write_recipe(work: Path) -> None:
    """The simulated recipe with the three artifacts (sizes tiny, so the preflight uses the real ones)."""
    text = (ROOT / "assets/recipes/simulated.toml").read_text()
    head, _, rest = text.partition("[[artifacts]]")
    tail = rest[rest.index("\n[engine]"):]
    arts = "".join(f'[[artifacts]]\nid = "{a}"\nprefix = "{a}.tar.zst.part."\nyields = "{a}"\n'
                   f'extracted_gib = 0.01\ncontents = "bench"\nrequired_for_serving = false\n\n' for a in SHARES)
    (work / "bench-recipe.toml").write_text(head + arts + tail.lstrip("\n"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=3.0, help="extracted data of the three artifacts together (default 3)")
    ap.add_argument("--part-mib", type=int, default=128, help="part size (default 128 MiB)")
    ap.add_argument("--runs", type=int, default=2, help="runs of each pipeline per scenario, interleaved (default 2)")
    ap.add_argument("--cap-mbps", type=float, default=50, help="per-connection cap, MB/s (default 50)")
    ap.add_argument("--link-gbps", type=float, default=1.0, help="total link cap of the third scenario, GB/s (default 1)")
    ap.add_argument("--card-runs-capped", type=int, metavar="N",
                    help="card runs in the capped scenarios (default --runs; one capped connection is slow)")
    ap.add_argument("--capped-connections", type=int, metavar="N",
                    help="panel --connections in the capped scenarios (default --connections)")
    ap.add_argument("--also-sequential", action="store_true",
                    help="unthrottled: also run the panel one artifact at a time (--artifact-jobs 1)")
    ap.add_argument("--connections", type=int, default=8, help="panel --connections (default 8)")
    ap.add_argument("--data", choices=["weights", "compressible"], default="weights",
                    help="'weights' (default) = like the cache's files: planes/FP4 packs near-random, scales "
                         "compressible; 'compressible' = every byte 4 bits of entropy (~2:1)")
    ap.add_argument("--work", default="/var/tmp/moet-panel-bench3", help="work dir (artifacts are cached here)")
    ap.add_argument("--panel-arg", action="append", default=[], help="extra argument for moet-panel download")
    ap.add_argument("--only", action="append", choices=["unthrottled", "capped", "capped+link", "none"],
                    help="run only these scenarios")
    ap.add_argument("--single", metavar="ARTIFACT", help="first: the card's pipeline vs the panel for this "
                    "artifact alone, unthrottled")
    ap.add_argument("--profile", metavar="DIR", help="also profile the panel with py-spy into DIR: with --single that "
                    "artifact alone, else one more run per scenario (every process: --subprocesses)")
    ap.add_argument("--timeline", action="store_true", help="run the panel under bench/download_timeline.py and "
                    "print when each stage began and ended, from the process's start")
    ap.add_argument("--series", action="store_true", help="with --timeline (implied): also fetched / verified / "
                    "decoded MiB per artifact every 0.25 s")
    ap.add_argument("--baseline", metavar="REV", help="also run the panel of this commit (a git worktree) or directory, "
                    "interleaved with this one, in every scenario")
    args = ap.parse_args()
    work = Path(args.work) / args.data
    arts = build(work, args.gib, args.part_mib, args.data)
    expect = reference(work, arts)
    write_recipe(work)
    baseline = worktree(Path(args.work), args.baseline) if args.baseline else None
    if args.series:  # read by bench/download_timeline.py in the panel's process
        args.timeline, os.environ["MOET_TIMELINE_SERIES"] = True, "1"
    entry = (str(ROOT / "bench/download_timeline.py"),) if args.timeline else ("-m", "app.cli.main")
    print(f"load average at start: {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs", flush=True)
    for art, parts in arts.items():
        n, size, phys = expect[art]
        print(f"  {art:<12} {len(parts):3d} parts  {sum(p.stat().st_size for p in parts) / GiB:6.2f} GiB compressed  "
              f"{size / GiB:6.2f} GiB apparent  {phys / GiB:6.2f} GiB physical  {n} files", flush=True)
    limits = stage_limits(arts, work, expect, rounds=2)
    for name, (secs, how) in limits.items():
        print(f"  limit {name:<7} {secs:6.2f} s  ({how})", flush=True)
    if args.single:
        run_single(args.single, arts, work, args.runs, args.panel_arg, expect, args.connections,
                   Path(args.profile) if args.profile else None, entry)
    scenarios = [Scenario("unthrottled", None, None),
                 Scenario("capped", args.cap_mbps * MB, None),
                 Scenario("capped+link", args.cap_mbps * MB, args.link_gbps * 1000 * MB)]
    for sc in scenarios:
        if args.only is not None and sc.name not in args.only:
            continue
        conns = args.capped_connections if sc.conn_cap and args.capped_connections else args.connections
        run_scenario(sc, arts, work, args.runs, args.panel_arg, expect, conns,
                     args.card_runs_capped if args.card_runs_capped is not None else args.runs, args.also_sequential,
                     baseline, entry, None if args.single else (Path(args.profile) if args.profile else None))
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    print(f"\n{os.cpu_count()} CPUs, {compressed(arts) / GiB:.2f} GiB compressed, {args.data} data; medians of "
          f"{args.runs} interleaved runs, each to `sync`")
    print("| scenario | connections | card (3 in sequence) | panel (all three) | limit (binding stage) | panel/card |"
          " panel/limit | card CPU | panel CPU | panel peak RSS | panel peak PSS | panel peak staging | panel, one artifact at a time |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for sc in scenarios:
        if not sc.panel:
            continue
        panel = statistics.median(r.wall for r in sc.panel)
        stage = {**{k: v[0] for k, v in limits.items()}, "fetch": sc.fetch_limit}
        binding = max(stage, key=lambda k: stage[k])
        limit = stage[binding]
        cpu_p = statistics.median(r.cpu for r in sc.panel)
        card_s = ratio = cpu_cell = "—"  # --card-runs-capped 0: the card's one capped connection is not timed
        if sc.card:
            card, cpu_c = statistics.median(r.wall for r in sc.card), statistics.median(r.cpu for r in sc.card)
            card_s, ratio, cpu_cell = f"{card:.2f} s", f"{card / panel:.2f}×", f"{cpu_c:.1f} s ({100 * cpu_c / card:.0f}%)"
        seq = f"{statistics.median(r.wall for r in sc.panel1):.2f} s" if sc.panel1 else "—"
        print(f"| {sc.name} | {sc.connections} | {card_s} | {panel:.2f} s | {limit:.2f} s ({binding}) | {ratio} | "
              f"{panel / limit:.2f}× | {cpu_cell} | {cpu_p:.1f} s "
              f"({100 * cpu_p / panel:.0f}%) | {max(r.rss_kib for r in sc.panel) / 1024:.0f} MiB | "
              f"{max(r.pss_kib for r in sc.panel) / 1024:.0f} MiB | "
              f"{max(r.staging for r in sc.panel) / GiB:.2f} GiB | {seq} |")
    for sc in scenarios:
        if sc.base:
            base, panel = statistics.median(r.wall for r in sc.base), statistics.median(r.wall for r in sc.panel)
            print(f"{sc.name}: panel {panel:.2f} s against the baseline {args.baseline} {base:.2f} s "
                  f"({base / panel:.2f}× as fast; runs " + " / ".join(f"{r.wall:.2f}" for r in sc.panel)
                  + " against " + " / ".join(f"{r.wall:.2f}" for r in sc.base) + "; "
                  + verdict([r.wall for r in sc.panel], [r.wall for r in sc.base]) + ")")
    print("stage limits: " + "; ".join(f"{k} {v[0]:.2f} s" for k, v in limits.items())
          + "; fetch " + ", ".join(f"{sc.name} {sc.fetch_limit:.2f} s"
                                   + (f" (measured {sc.fetch_measured:.2f} s)" if sc.fetch_measured else "")
                                   for sc in scenarios if sc.panel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
