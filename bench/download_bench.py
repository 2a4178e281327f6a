"""Benchmark: the card's bash pipeline vs `moet-panel download`, same local hub, same artifact.

One invocation: build a several-GiB artifact with the real CLIs (GNU tar --sparse | zstd | split),
serve it from the SIMULATED hub, then run card and panel alternately (>= 3 runs each) into disk,
unthrottled and with every connection capped at 50 MB/s; print medians, ratios, panel peak RSS.
Run via `bench/download` (see --help). Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.backend.simhub.artifacts import TreeSpec, build_artifact, generate_tree  # noqa: E402
from app.backend.simhub.server import SimHub  # noqa: E402

REPO = "moet-panel/simulated-cache"
PREFIX = "planescache.tar.zst.part."
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
fetch planescache | zstd -d -T4 | tar -x --sparse
sync  # both pipelines are timed until the tree is on disk
"""


def build(work: Path, gib: float, part_mib: int, data: str) -> list[Path]:
    marker = work / f".built-{gib}-{part_mib}-{data}"
    repo = work / "repo"
    if marker.exists():
        return sorted(repo.glob(PREFIX + "*"))
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    t = time.monotonic()
    per_file = 128 * MiB
    layers = max(1, int(gib * GiB / per_file / 6))
    generate_tree(work / "src", TreeSpec(top="planescache", layers=layers, file_size=per_file,
                                         sparse_size=1 * GiB, sparse_extents=8, ckpt_id="bench", seed=3,
                                         weights_like=(data == "weights")))
    parts = build_artifact(work / "src", "planescache", repo, PREFIX, part_mib * MiB)
    shutil.rmtree(work / "src")
    marker.touch()
    print(f"built {len(parts)} parts, {sum(p.stat().st_size for p in parts) / GiB:.2f} GiB compressed, "
          f"{layers * 6 * per_file / GiB:.2f} GiB extracted (+1 GiB sparse) in {time.monotonic() - t:.0f} s", flush=True)
    return parts


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, int, int]:
    """(seconds, exit code, peak RSS KiB of that one child process)."""
    subprocess.run(["sync"], check=False)
    t = time.monotonic()
    p = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    elapsed = time.monotonic() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if p.returncode != 0:
        print(f"  ! {cmd[0]} exited {p.returncode}: {err.strip()[-400:]}", flush=True)
    return elapsed, p.returncode, usage.ru_maxrss


def check_tree(dest: Path, expected_files: int, expected_bytes: int) -> str:
    files = [f for f in (dest / "planescache").rglob("*") if f.is_file()]
    total = sum(f.stat().st_size for f in files)
    ok = len(files) == expected_files and total == expected_bytes
    return "ok" if ok else f"MISMATCH ({len(files)} files, {total} bytes)"


def scenario(name: str, hub: SimHub, work: Path, runs: int, connections: int | None,
             expect: tuple[int, int], extra: list[str]) -> tuple[float, float, int]:
    card_t, panel_t, rss = [], [], 0
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    env.pop("HF_TOKEN", None)
    for i in range(runs):
        for kind in ("card", "panel"):
            dest = work / f"dest-{kind}"
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir()
            if kind == "card":
                cmd = ["bash", "-c", CARD, "card", hub.endpoint, REPO, str(dest)]
            else:
                cmd = [str(ROOT / ".venv/bin/python"), "-m", "app.cli.main", "download", "planescache",
                       "--recipe", str(ROOT / "assets/recipes/simulated.toml"), "--dest", str(dest),
                       "--endpoint", hub.endpoint]
                if connections:
                    cmd += ["--connections", str(connections)]
                cmd = ["bash", "-c", '"$@" && sync', "panel", *cmd + extra]
            secs, rc, maxrss = timed(cmd, env)
            verdict = check_tree(dest, *expect) if rc == 0 else "FAILED"
            (card_t if kind == "card" else panel_t).append(secs)
            if kind == "panel":
                rss = max(rss, maxrss)
            print(f"  {name:<11} run {i + 1} {kind:<5} {secs:7.2f} s  tree {verdict}", flush=True)
            shutil.rmtree(dest, ignore_errors=True)
    return statistics.median(card_t), statistics.median(panel_t), rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=3.0, help="extracted size of the data files (default 3)")
    ap.add_argument("--part-mib", type=int, default=128, help="part size (default 128 MiB)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each pipeline per scenario (default 3)")
    ap.add_argument("--cap-mbps", type=float, default=50, help="per-connection cap, MB/s (default 50)")
    ap.add_argument("--connections", type=int, help="panel --connections (default: the panel's default)")
    ap.add_argument("--data", choices=["weights", "compressible"], default="compressible",
                    help="file contents: 'weights' = like the cache's files (planes/FP4 packs near-random, "
                         "scales compressible; zstd decodes fast, tar's writes bound the card), "
                         "'compressible' = every byte 4 bits of entropy (~2:1; both pipelines wait on "
                         "the same single-threaded zstd decode)")
    ap.add_argument("--work", default="/var/tmp/moet-panel-bench", help="work dir (artifact is cached here)")
    ap.add_argument("--panel-arg", action="append", default=[], help="extra argument for moet-panel download")
    ap.add_argument("--only", choices=["unthrottled", "capped"], help="run one scenario")
    args = ap.parse_args()
    work = Path(args.work) / args.data
    parts = build(work, args.gib, args.part_mib, args.data)
    ref = work / "ref-count"
    if not ref.exists():  # count files/bytes once from a reference `tar -x`
        probe = work / "probe"
        shutil.rmtree(probe, ignore_errors=True)
        probe.mkdir()
        subprocess.run(f"cat {work}/repo/{PREFIX}* | zstd -dq | tar -x --sparse -C {probe}", shell=True, check=True,
                       executable="/bin/bash")
        files = [f for f in (probe / "planescache").rglob("*") if f.is_file()]
        ref.write_text(f"{len(files)} {sum(f.stat().st_size for f in files)}")
        shutil.rmtree(probe)
    expect = tuple(int(x) for x in ref.read_text().split())
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    print(f"artifact ({args.data} data): {len(parts)} parts, {sum(p.stat().st_size for p in parts) / GiB:.2f} GiB compressed; "
          f"{os.cpu_count()} CPUs", flush=True)
    results = {}
    for name, cap in (("unthrottled", None), ("capped", args.cap_mbps * MB)):
        if args.only and args.only != name:
            continue
        hub = SimHub(rate_cap_bps=cap)
        hub.add_repo(REPO, {p.name: p for p in parts})
        with hub.start():
            label = name if cap is None else f"{name} ({args.cap_mbps:g} MB/s per connection)"
            print(f"== {label}", flush=True)
            results[name] = scenario(name, hub, work, args.runs, args.connections, expect, args.panel_arg)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    print("\nscenario      card median   panel median   panel/card speed   panel peak RSS")
    for name, (card, panel, rss) in results.items():
        print(f"{name:<12} {card:9.2f} s   {panel:10.2f} s   {card / panel:12.2f}x       {rss / 1024:7.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
