"""`moet-panel download` with a timeline: when each stage began and ended, from the process's start.

Run as `PYTHONPATH=<a tree> python bench/download_timeline.py download ARGS...` (bench/download
--timeline does, for the baseline's tree too): the CLI runs unchanged in this process, its own
import order kept; hooks mark when its imports were done (the listing began), the listing ended and
the first artifact process was asked for. A thread samples the progress board every 10 ms (an
artifact process's counters reach that board every 0.1 s, so its times are ±0.1 s) and, at exit,
one line per artifact goes to stderr: first byte on the wire, first part verified, first byte
extracted, every byte fetched, every byte verified, done, and what was left to decode and to write
when the last part verified. Where the start-up goes is the question it answers
(docs/downloads.md, "What binds now"). A bench tool, not part of the panel.
"""

from __future__ import annotations

import atexit
import os
import importlib.abc
import importlib.machinery
import sys
import threading
import time
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Any



def _started() -> float:
    """When the kernel started this process, as time.time(): its age from /proc (10 ms ticks; the
    boot time psutil adds is rounded to whole seconds)."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


STARTED = _started()
EVERY_S = 0.01
SERIES_EVERY_S = 0.25  # with MOET_TIMELINE_SERIES=1: fetched / verified / decoded MiB per artifact this often
MARKS = ("wire", "verified", "written", "fetched", "all verified", "done")


def since_start() -> float:
    return time.time() - STARTED


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a hook right after a module has executed, before anyone binds its names: the CLI's own
    import order (the forkserver first, docs/downloads.md) stays as it is."""

    def __init__(self, hooks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        hook = self.hooks.pop(name, None)
        if hook is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not isinstance(spec.loader, importlib.abc.Loader):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            hook(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _backlog(at: dict[str, tuple[int, int]], last: tuple[int, int] | None) -> str:
    """What was still to decode and to write when the last part verified: the run's tail."""
    if "all verified" not in at or last is None:
        return ""
    (dec, wr), (dec_end, wr_end) = at["all verified"], last
    return f" (then left: decode {(dec_end - dec) / 2**20:.0f} MiB compressed, write {(wr_end - wr) / 2**20:.0f} MiB)"


def _decode_rates(m: dict[str, float], at: dict[str, tuple[int, int]]) -> str:
    """The decoder's pace while the fetch went on (first part verified → every byte fetched) and after
    it (→ done): a decoder slowed by what the fetch costs shows as the first far below the second
    (docs/downloads.md, "The GIL's switch interval")."""
    def rate(a: str, b: str) -> str:
        if a not in m or b not in m or m[b] - m[a] < 0.05:
            return "—"
        return f"{(at[b][0] - at[a][0]) / 2**20 / (m[b] - m[a]):.0f}"
    if not {"verified", "fetched", "done"} <= at.keys():
        return ""
    return f"; decoded MiB/s (compressed) during the fetch {rate('verified', 'fetched')}, after {rate('fetched', 'done')}"


def main() -> int:
    marks: dict[str, float] = {"python": since_start()}
    seen: dict[str, dict[str, float]] = {}
    at_mark: dict[str, dict[str, tuple[int, int]]] = {}  # (decoded, written) bytes when each mark was hit
    last: dict[str, tuple[int, int]] = {}  # ... and at the last sample
    series: dict[str, list[str]] = {}
    series_on = os.environ.get("MOET_TIMELINE_SERIES") == "1"
    next_point = [0.0]
    boards: list[Any] = []
    stop = threading.Event()

    def on_progress(mod: ModuleType) -> None:
        init = mod.ProgressBoard.__init__

        def board_init(self: Any, *a: Any, **kw: Any) -> None:
            init(self, *a, **kw)
            boards.append(self)
        mod.ProgressBoard.__init__ = board_init

    def on_plan(mod: ModuleType) -> None:
        prepare = vars(mod)["prepare"]

        def timed_prepare(*a: Any, **kw: Any) -> Any:
            marks.setdefault("imports", since_start())  # the CLI's own imports and start-up are done
            out = prepare(*a, **kw)
            marks["listed"] = since_start()
            return out
        vars(mod)["prepare"] = timed_prepare

    def on_procs(mod: ModuleType) -> None:
        run_in_child = vars(mod)["run_in_child"]

        def timed_run(*a: Any, **kw: Any) -> Any:
            marks.setdefault("first child", since_start())
            return run_in_child(*a, **kw)
        vars(mod)["run_in_child"] = timed_run

    sys.meta_path.insert(0, _AfterImport({"app.backend.download.progress": on_progress,
                                          "app.backend.download.plan": on_plan,
                                          "app.backend.download.procs": on_procs}))

    def sample() -> None:
        while not stop.wait(EVERY_S):
            point = series_on and since_start() >= next_point[0]
            if point:
                next_point[0] = since_start() + SERIES_EVERY_S
            for board in list(boards):
                for a in board.snapshot():
                    t, m = since_start(), seen.setdefault(a.id, {})
                    if point:
                        series.setdefault(a.id, []).append(
                            f"{t:.2f}:{a.fetched_bytes >> 20}/{a.verified_bytes >> 20}/{a.decoded_bytes >> 20}")
                    for name, hit in (("wire", a.wire_bytes > 0), ("verified", a.verified_bytes > 0),
                                      ("written", a.extracted_bytes > 0),
                                      ("fetched", a.total_bytes > 0 and a.fetched_bytes >= a.total_bytes),
                                      ("all verified", a.total_bytes > 0 and a.verified_bytes >= a.total_bytes),
                                      ("done", a.state.value == "done")):
                        if hit and name not in m:
                            m[name] = t
                            at_mark.setdefault(a.id, {})[name] = (a.decoded_bytes, a.extracted_bytes)
                    last[a.id] = (a.decoded_bytes, a.extracted_bytes)

    def report() -> None:
        stop.set()
        marks["exit"] = since_start()
        lines = ["timeline (s from the process's start): " + " ".join(f"{k} {v:.2f}" for k, v in marks.items())]
        lines += [f"timeline {art}: " + " ".join(f"{k} {m[k]:.2f}" for k in MARKS if k in m) + _backlog(at_mark.get(art, {}), last.get(art))
                  + _decode_rates(m, at_mark.get(art, {})) for art, m in seen.items()]
        lines += [f"series {art} (s: fetched/verified/decoded MiB): " + " ".join(pts) for art, pts in series.items()]
        print("\n".join(lines), file=sys.stderr, flush=True)

    threading.Thread(target=sample, name="timeline", daemon=True).start()
    atexit.register(report)
    from app.cli import main as cli  # noqa: PLC0415 (after the hooks)
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
