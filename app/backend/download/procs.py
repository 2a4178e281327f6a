"""Artifacts side by side in child processes, one per artifact (docs/downloads.md, "Three artifacts at once").

Why processes: in one process the three decoders, tar writers and verifiers and ~18 fetch workers
share one GIL (figures: docs/downloads.md, "Three artifacts at once"). A child process runs one
`ArtifactRun`, exactly the code a 2-core box runs in a thread (runner.py picks one per core budget).

Children come from a forkserver: a clean single-threaded process that has already imported the
download code, forked for each artifact. Not fork() of this process, which has threads (the CLI's
progress, the panel's server) whose locks a forked child could inherit held.

What crosses: the config, plan, journal and pinned commit go in as the Process arguments; the
connection budget and the group stop are shared primitives (group.RunGroup, budget.py); the child's board is
mirrored into the parent's every RELAY_S (ProgressBoard.export / mirror); the result (None or the
exception) comes back last. A child whose parent dies (kill -9) exits at once: it must never go on
writing into a destination whose lock has gone.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import pickle
import sys
import threading
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

from app.backend.download.forkserver import context
from app.backend.download.types import DownloadError, Stopped
from app.backend.files.atomic import PidLock

if TYPE_CHECKING:
    from app.backend.download.hub import HubClient, Resolved
    from app.backend.download.group import RunGroup
    from app.backend.download.journal import ArtifactJournal
    from app.backend.download.progress import ProgressBoard
    from app.backend.download.types import ArtifactPlan, ArtifactProgress, DownloadConfig

RELAY_S = 0.1
EXIT_ORPHANED = 75
# A thread that wants the GIL back waits at most this long for the holder to let go (CPython's
# default: 5 ms). The decoder and the tar writer take it back after every buffer, beside up to 16
# fetch workers' libcurl callbacks (docs/downloads.md, "The GIL's switch interval").
GIL_SWITCH_S = 0.0005
CORES_PER_ARTIFACT = 2  # one chain keeps ~1.5 cores busy (runner.artifact_jobs)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def start_early() -> None:
    """Start the forkserver now: it imports the download code while this process does its own imports
    and lists the repo, so the children are ready when the plans are."""
    context()
    from multiprocessing import forkserver
    forkserver.ensure_running()


def start_early_on_many_cores() -> None:
    """For the CLI, before it imports the download code: only where artifacts will run side by side
    (on 2 cores the forkserver's imports would take CPU from this process's own)."""
    if available_cores() >= 2 * CORES_PER_ARTIFACT:
        start_early()


def run_in_child(cfg: DownloadConfig, hub: HubClient, plan: ArtifactPlan, journal: ArtifactJournal,
                 group: RunGroup, board: ProgressBoard, progress: ArtifactProgress) -> None:
    """Run one artifact in a child process, mirroring its board into `board`; raise what it raised."""
    ctx = context()
    ours, theirs = ctx.Pipe()
    known = hub.known([p.name for p in plan.parts])
    proc = ctx.Process(target=_child_main, name=f"moet-download-{plan.id}", daemon=False,
                       args=(cfg, plan, journal, (hub.commit, hub.repo, known), group, theirs, progress))
    proc.start()
    theirs.close()
    ended, result = False, None
    try:
        while not ended:
            try:
                kind, payload = ours.recv()
            except EOFError:
                break
            except KeyboardInterrupt:  # Ctrl-C: the child got it too and pauses; keep relaying until it ends
                group.stop.set()
                continue
            if kind == "mirror":
                board.mirror(payload)
            else:
                ended, result = True, payload
    finally:
        proc.join()
        ours.close()
    if not ended:
        from app.backend.download.statemachine import Failed
        group.budget.forget(group.rank(plan.id))
        group.set_remaining(plan.id, 0)
        exc = DownloadError(f"{plan.id}: its download process ended unexpectedly (exit code {proc.exitcode}); "
                            "everything verified is kept: Resume continues where it stopped")
        if board.state(plan.id).active:
            board.apply(plan.id, Failed(exc.message))
        raise exc
    if result is not None:
        raise result


def _child_main(cfg: DownloadConfig, plan: ArtifactPlan, journal: ArtifactJournal,
                pinned: tuple[str, str, dict[str, Resolved]], group: RunGroup, conn: Connection,
                progress: ArtifactProgress) -> None:
    from app.backend.download.hub import HubClient
    from app.backend.download.job import ArtifactRun
    from app.backend.download.journal import JournalStore, downloads_dir
    from app.backend.download.progress import ProgressBoard

    sys.setswitchinterval(GIL_SWITCH_S)
    _exit_with_parent()
    done = threading.Event()
    relay: threading.Thread | None = None
    lock: PidLock | None = None
    result: BaseException | None = None
    try:  # everything, set-up included: the parent gets the real error, not "ended unexpectedly"
        # per artifact: a child of a killed run that has not exited yet finishes before this one writes
        lock = PidLock(downloads_dir(cfg.dest) / f".{plan.id}.lock").acquire(wait=True)
        board = ProgressBoard()
        board.register(progress)
        hub = HubClient(cfg)
        hub.commit, hub.repo, known = pinned
        hub.remember(known)
        relay = threading.Thread(target=_relay, args=(board, plan.id, conn, done), name="relay", daemon=True)
        relay.start()
        ArtifactRun(cfg, hub, plan, journal, JournalStore(cfg.dest), board, group).run()
    except BaseException as exc:  # handed to the parent, which raises it
        result = _portable(exc, plan.id)
    finally:
        done.set()
        if relay is not None:
            relay.join()
        conn.send(("end", result))
        conn.close()
        if lock is not None:
            lock.release()


def _relay(board: ProgressBoard, art_id: str, conn: Connection, done: threading.Event) -> None:
    cursor = 0
    while True:
        last = done.wait(RELAY_S)
        mirror, cursor = board.export(art_id, cursor)
        conn.send(("mirror", mirror))
        if last:
            return


def _exit_with_parent() -> None:
    """Exit as soon as the parent is gone (kill -9, OOM killer): its destination lock has gone with it."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()




def _portable(exc: BaseException, art_id: str) -> BaseException:
    if isinstance(exc, KeyboardInterrupt):
        return Stopped()
    try:
        pickle.dumps(exc)
    except Exception as unpicklable:  # noqa: BLE001 - whatever it was, the parent gets (and raises) a message
        return DownloadError(f"internal error in the {art_id} download process: {type(exc).__name__}: {exc} "
                             f"(not picklable: {type(unpicklable).__name__})")
    return exc
