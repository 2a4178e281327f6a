"""`moet-panel download [ARTIFACT ...]`: verified, resumable, parallel download + extraction.

Exit 0 only when every requested artifact is complete and verified; otherwise one clear line on
stderr and a non-zero code (1 failed, 3 paused/resumable e.g. disk full, 4 destination locked).
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from app.backend.download.ckpt import check_ckpt_id
from app.backend.download.config import make_config
from app.backend.download.journal import DestLock, clean_partial
from app.backend.download.progress import ProgressBoard
from app.backend.download.runner import run_download
from app.backend.download.types import (
    ArtifactProgress, ArtifactState, DownloadError, LockedError, MiB, SpaceError, Stopped,
)
from app.backend.config.hf_token import redact
from app.backend.contracts import GiB, count_text, duration_text, size_text
from app.cli.main import add_common, settings_from

if TYPE_CHECKING:
    from rich.console import Console


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("download", help="download, verify and extract the recipe's artifacts")
    add_common(p, json_help="accepted; download prints progress, no data")
    p.add_argument("artifacts", nargs="*", metavar="ARTIFACT", help="artifact ids (default: all in the recipe)")
    p.add_argument("--dest", metavar="DIR", help="destination (default: the data dir)")
    p.add_argument("--endpoint", metavar="URL", help="Hub endpoint (default: HF_ENDPOINT, then the recipe)")
    p.add_argument("--repo", metavar="OWNER/NAME", help="repo (default: the recipe's)")
    p.add_argument("--revision", metavar="REV", help="branch/tag/commit (default: the recipe's)")
    p.add_argument("--connections", type=int, metavar="N", help="parallel connections (default 8)")
    p.add_argument("--token-file", metavar="F",
                   help="file holding the HF token; beats HF_TOKEN and the saved token files (default: HF_TOKEN, "
                        "then the panel's saved token, then huggingface_hub's token file)")
    p.add_argument("--clean", action="store_true", help="remove partial data (staging, unfinished journals) and exit")
    p.add_argument("--staging-gib", type=float, metavar="GIB",
                   help="cap on staging disk (default: auto, up to the whole compressed artifact while free disk allows)")
    p.add_argument("--segment-mib", type=int, metavar="MIB", help=argparse.SUPPRESS)
    p.add_argument("--artifact-jobs", type=int, metavar="N", help=argparse.SUPPRESS)  # bench: default from the cores
    p.add_argument("--stall-timeout", type=float, metavar="S", help="seconds without a byte before a connection is retried (default 30)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    recipe = settings.recipe
    specs = [recipe.artifact(a) for a in args.artifacts] if args.artifacts else list(recipe.artifacts)
    extra: dict = {}
    if args.segment_mib:
        extra["segment_size"] = args.segment_mib * MiB
    if args.artifact_jobs:
        extra["artifact_jobs"] = args.artifact_jobs
    if args.staging_gib:
        extra["staging_max"] = int(args.staging_gib * GiB)
    if args.stall_timeout:
        extra["stall_s"] = args.stall_timeout
    demo = None
    endpoint = args.endpoint
    if recipe.simulated and not endpoint and not args.clean:
        from app.backend.simhub.demo import start_demo_hub

        demo = start_demo_hub(settings.state_dir / "simhub")
        endpoint = demo.endpoint
        _stderr().print(f"[yellow]SIMULATED[/] hub serving the demo artifact at {endpoint}")
    try:
        cfg = make_config(settings, dest=Path(args.dest).absolute() if args.dest else None, endpoint=endpoint,
                          repo=args.repo, revision=args.revision, connections=args.connections,
                          token_file=args.token_file, **extra)
        if args.clean:
            return _clean(cfg.dest, [s.id for s in specs])
        return _download(cfg, specs, settings)
    except ValueError as exc:
        print(f"moet-panel download: {redact(str(exc))}", file=sys.stderr)
        return 2
    finally:
        if demo:
            demo.stop()


def _stderr() -> Console:
    # rich imported here, not at the top: the listing does not wait for it (start-up time of `download`, docs/downloads.md)
    from rich.console import Console

    return Console(stderr=True)


def _clean(dest: Path, ids: list[str]) -> int:
    try:
        with DestLock(dest):
            freed = clean_partial(dest, ids)
    except LockedError as exc:
        print(f"moet-panel download: {exc}", file=sys.stderr)
        return 4
    _stderr().print(f"removed partial download data under {dest}: {size_text(freed)} freed")
    return 0


def _download(cfg, specs, settings) -> int:
    board, stop = ProgressBoard(), threading.Event()
    outcome: dict[str, BaseException | None] = {"exc": None}

    listed = threading.Event()  # the plans are on the board, or the run ended before them

    def work() -> None:
        try:
            run_download(cfg, specs, board, stop, on_prepared=lambda _: listed.set())
        except BaseException as exc:  # reported by the main thread
            outcome["exc"] = exc
        finally:
            listed.set()

    worker = threading.Thread(target=work, name="download", daemon=True)
    worker.start()
    try:
        listed.wait()  # rich after the listing: imported beside it, it takes the GIL from it
        err = _stderr()
        _show_progress(board, worker, err)
    except KeyboardInterrupt:
        stop.set()
        err = _stderr()
        err.print("pausing… (verified data is kept; rerun the same command to resume)")
        worker.join()
    return _report(board, outcome["exc"], specs, settings, cfg, err)


def eta_text(s: float | None) -> str:
    return "ETA " + duration_text(s)


def progress_line(a: ArtifactProgress) -> str:
    """One artifact: verified / total, verified and extracted rates, the binding limit, ETA, state."""
    state = "stalled (0 B/s)" if a.stalled else a.state.value
    bits = [f"{size_text(a.verified_bytes)} / {size_text(a.total_bytes)} verified"]
    if a.state.active:
        bits.append(f"{size_text(a.verified_bps)}/s verified · {size_text(a.extracted_bps)}/s extracted")
        if a.binding:
            bits.append(f"limit: {a.binding.value}")
        bits.append(eta_text(a.eta_s))
    if a.extracted_files:
        bits.append(f"{a.extracted_files} files")
    return " · ".join([state, *bits])


def _show_progress(board: ProgressBoard, worker: threading.Thread, err: Console) -> None:
    from rich.progress import BarColumn, Progress, TaskID, TextColumn  # as in _stderr()

    columns = [TextColumn("{task.fields[name]:<12}"), BarColumn(), TextColumn("{task.fields[status]}")]
    tasks: dict[str, TaskID] = {}
    with Progress(*columns, console=err, disable=not err.is_terminal, refresh_per_second=4) as bars:
        while True:  # shown at once, then every 0.5 s; once more when the worker has ended
            arts = board.snapshot()
            for a in arts:
                if a.id not in tasks:
                    tasks[a.id] = bars.add_task("", total=a.total_bytes, name=a.id, status="")
                bars.update(tasks[a.id], completed=a.verified_bytes, status=progress_line(a))
            if len(arts) > 1:
                total = board.overall(arts)
                if "total" not in tasks:
                    tasks["total"] = bars.add_task("", total=sum(a.total_bytes for a in arts), name="total", status="")
                disk = board.disk()
                bars.update(tasks["total"], completed=sum(a.verified_bytes for a in arts),
                            status=f"{size_text(total.rate_bps)}/s on the wire · {size_text(total.extracted_bps)}/s extracted"
                                   f"{f' · limit: {total.binding.value}' if total.binding else ''} · {eta_text(total.eta_s)}"
                                   f" · staging {size_text(disk.staging_used if disk else 0)}")
            if not worker.is_alive():
                break
            worker.join(0.5)


def _report(board, exc, specs, settings, cfg, err: Console) -> int:
    snaps = {a.id: a for a in board.snapshot()}
    for a in snaps.values():
        reused = f", resumed reusing {a.reused_parts} of {a.parts_total} parts" if a.reused_parts else ""
        err.print(f"{a.id}: {a.state.value}  {size_text(a.verified_bytes)} verified, {size_text(a.extracted_bytes)} written, "
                  f"{a.extracted_files} files extracted ({a.skipped_files} already complete){reused}"
                  + (f" — {a.reason}" if a.reason and a.state != ArtifactState.DONE else ""))
        waits = board.waits(a.id)
        if any(waits.values()):
            err.print(f"{a.id}: the extractor waited " + ", ".join(f"{k.value} {v:.1f} s" for k, v in waits.items()))
    disk = board.disk()
    if disk is not None:
        err.print(f"peak staging disk: {size_text(disk.staging_peak)} ({disk.staging_peak} bytes)")
    if exc is not None:
        code = 4 if isinstance(exc, LockedError) else 3 if isinstance(exc, (SpaceError, Stopped)) else 1
        msg = str(exc) if isinstance(exc, DownloadError) else (
            "paused; rerun the same command to resume" if isinstance(exc, Stopped)
            else f"internal error: {type(exc).__name__}: {exc}")
        print(f"moet-panel download: {redact(msg)}", file=sys.stderr)
        return code
    if not all(snaps.get(s.id) and snaps[s.id].state == ArtifactState.DONE for s in specs):
        print("moet-panel download: not every requested artifact completed; rerun to resume", file=sys.stderr)
        return 1
    if any(s.id == "planescache" for s in specs):
        check = check_ckpt_id(settings, cfg.dest)
        err.print(f"ckpt-id check: {check.status.upper()} — {check.message}")
    label = " (SIMULATED)" if cfg.simulated else ""
    err.print(f"{'the' if len(specs) == 1 else 'all'} {count_text(len(specs), 'artifact')} complete and verified in "
              f"{cfg.dest}{label}")
    return 0
