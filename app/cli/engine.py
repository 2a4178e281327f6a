"""`moet-panel engine status|preflight|start|stop|switch|logs|build-image|builds|promote|rollback`.

Exit codes: 0 success; 1 the operation failed (diagnosis printed); 2 refused / bad input (including the
engine lock held by another panel or CLI, named in the message); 3 Docker unreachable.
`engine status` answers with the engine's state (docs/engine.md, "engine status"): 0 ready, 1 failed,
3 Docker unreachable, 4 stopped, 5 starting / stopping (in transition), 6 stalled.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.backend.engine.controller import EngineController
from app.backend.state import make_box_gpus
from app.backend.engine.gpus import BoxGpus, GpuSelectionError
from app.backend.telemetry.gpu import box_gpu_count, follow_engine, make_gpu_reader
from app.backend.engine.builds.image import BuildEvent, ImageBuildRefused, build_image, build_mark, check_source
from app.backend.files.atomic import LockBusy
from app.backend import oplog
from app.backend.engine.lifecycle.tickets import ControllerOptions, Ticket
from app.backend.contracts import Diagnosis, EngineSnapshot, LogLine
from app.backend.telemetry.hostprobe import detect_demo
from app.backend.config.settings import Settings
from app.backend.alerts.rules import run_log_lines, status_alerts, trace_of
from app.backend.telemetry.nvml import NvmlGpuReader
from app.backend.telemetry.trace import TraceSnapshot
from app.cli.main import add_common, settings_from

EXIT_OK, EXIT_FAILED, EXIT_REFUSED, EXIT_UNREACHABLE = 0, 1, 2, 3
EXIT_STOPPED, EXIT_TRANSITION, EXIT_STALLED = 4, 5, 6
STATUS_EXIT = {"ready": EXIT_OK, "failed": EXIT_FAILED, "stopped": EXIT_STOPPED, "starting": EXIT_TRANSITION,
               "preflight": EXIT_TRANSITION, "stopping": EXIT_TRANSITION, "stalled": EXIT_STALLED}


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("engine", help="control the serving engine (Docker container)")
    add_common(p)
    es = p.add_subparsers(dest="engine_cmd", metavar="ACTION", required=True)
    st = es.add_parser("status", help="state, profile, boot phase, last diagnosis, alerts (one line per GPU)")
    st.add_argument("--gpu", metavar="N", help="the GPU whose engine the details are about (default 0)")
    pf = es.add_parser("preflight", help="checklist before starting (exit 1 when an item fails)")
    pf.add_argument("--profile")
    pf.add_argument("--gpu", metavar="N", help="the GPU whose engine to check (default 0)")
    actions = (("start", "start a profile and wait until ready"),
               ("switch", "switch profile (stop, wait for GPU memory, start, gate on ready; rolls back on failure)"))
    for name, helptext in actions:
        sp = es.add_parser(name, help=helptext)
        sp.add_argument("--profile", required=True)
        sp.add_argument("--override", action="append", default=[], metavar="ITEM",
                        help="start despite this failing preflight item (repeatable; ids from `engine preflight`)")
        sp.add_argument("--no-wait", action="store_true", help="return once accepted")
        sp.add_argument("--build", metavar="ID", help="the engine build to run (default: the current one; "
                        "`engine builds` lists them)")
        sp.add_argument("--gpu", metavar="all|N[,M…]",
                        help="the GPUs to " + name + " (default all: one engine per GPU; a switch of several "
                        "rolls one GPU at a time)")
        if name == "switch":
            sp.add_argument("--no-rollback", action="store_true", help="do not roll back to the last ready profile")
    sp = es.add_parser("stop", help="stop the engine (grace period, then SIGKILL)")
    sp.add_argument("--gpu", metavar="all|N[,M…]", help="the GPUs whose engines to stop (default all)")
    lg = es.add_parser("logs", help="the engine's log tail (stdout and stderr apart)")
    lg.add_argument("-f", "--follow", action="store_true")
    lg.add_argument("-n", "--lines", type=int, default=100)
    lg.add_argument("--stream", choices=["stdout", "stderr", "both"], default="both")
    lg.add_argument("--gpu", metavar="N", help="the GPU whose engine's log to show (default 0)")
    bi = es.add_parser("build-image", help="docker build the engine image from a vLLM-Moet checkout (--commit: "
                       "any commit, as a build the panel holds)")
    bi.add_argument("--source", metavar="DIR", help="checkout of the engine source (at the recipe commit unless "
                    "--commit)")
    bi.add_argument("--commit", metavar="REF", help="build this commit (branch, tag, hash) as a new build, at low "
                    "priority while the engine serves; with --demo: the SIMULATED variant `next`")
    bi.add_argument("--tag", help="image tag (default: the recipe's)")
    bi.add_argument("--dockerfile", help="Dockerfile path inside the source (default: the recipe's)")
    bi.add_argument("--allow-other-commit", action="store_true")
    bl = es.add_parser("builds", help="the engine builds: id, commit, image, current, evidence, size, date")
    bl.set_defaults(json=False)
    pr = es.add_parser("promote", help="make a build current (a local pin override) and switch to it with the drain")
    pr.add_argument("build_id", metavar="ID")
    es.add_parser("rollback", help="return to the build current before the last promotion")
    for action in es.choices.values():  # `engine status -h` lists the common options too
        add_common(action)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    nvml = NvmlGpuReader()  # this process's one NVML client: the demo probe reads it, the controller keeps it
    reason = detect_demo(bool(getattr(args, "demo", False)), gpu_reader=nvml)
    settings = settings_from(args, demo_reason=reason)
    # the decisions this command makes (and the errors it catches) reach the operator's log like the panel's;
    # stderr stays the user's (docs/engine.md "The operator's log")
    oplog.configure(settings.ensure_state_dir(), console=False)
    if args.engine_cmd == "build-image":
        nvml.close()
        return _build_commit(args, settings) if args.commit else _build_image(args, settings)
    if args.engine_cmd == "builds":
        nvml.close()
        return _builds(args, settings)
    reader = make_gpu_reader(settings, nvml_reader=nvml)
    # One engine per GPU of the box (docs/engine.md "Several GPUs"); a one-GPU box: the one engine, as before.
    box = make_box_gpus(settings, reader, box_gpu_count(reader), lambda gpu: ControllerOptions(
        auto_rollback=not getattr(args, "no_rollback", False), actor="CLI"))
    for g in box.gpus:
        follow_engine(reader, box.controller(g), g)
    try:
        gpu_arg = getattr(args, "gpu", None)
        try:
            chosen = box.select(gpu_arg)
        except GpuSelectionError as exc:
            print(str(exc), file=sys.stderr)
            return EXIT_REFUSED
        if args.engine_cmd in ("start", "switch", "stop") and len(box.gpus) > 1:
            return _box_op(args, box, chosen)
        ctl = box.controller(chosen[0] if gpu_arg is not None else box.gpus[0])
        if args.engine_cmd == "status":
            return _status(args, ctl, box)
        return {
            "preflight": _preflight, "start": _start, "switch": _start, "stop": _stop, "logs": _logs,
            "promote": _promote, "rollback": _promote,
        }[args.engine_cmd](args, ctl)
    finally:
        box.close()  # the panel's threads only; the engines keep running


def _box_op(args: argparse.Namespace, box: BoxGpus, gpus: list[int]) -> int:
    """start/stop on several GPUs at once; switch rolls one GPU at a time (docs/engine.md "Several GPUs")."""
    if args.engine_cmd == "switch":
        def step(gpu: int, t: Ticket) -> None:
            if not args.json:
                print(f"GPU {gpu}: {t.message}", flush=True)

        steps = box.rolling_switch(args.profile, gpus, tuple(args.override), who=oplog.CLI, on_step=step,
                                     build=getattr(args, "build", None))
        results: list[tuple[int, Ticket | None, bool, str]] = [
            (s.gpu, s.ticket, s.ok, "already serves it" if s.skipped else "") for s in steps]
    else:
        tickets = (box.start(args.profile, gpus, tuple(args.override), who=oplog.CLI, build=getattr(args, "build", None))
                   if args.engine_cmd == "start" else box.stop(gpus, who=oplog.CLI))
        for _, tk in tickets:
            if tk.accepted and not getattr(args, "no_wait", False):
                tk.wait()
        results = [(g, tk, bool(tk.accepted and tk.ok), "") for g, tk in tickets]
    out = []
    for g, t, ok, note in results:
        snap = box.controller(g).snapshot()
        message = note or (t.message if t is not None else "not switched: the roll stopped at an earlier GPU")
        out.append({"gpu": g, "ok": ok, "message": message, "engine": _snap_dict(snap)})
        if not args.json:
            print(f"GPU {g}: {'ok' if ok else 'FAILED'} — {message}")
            if not ok and t is not None and t.accepted:
                _print_diag(t.diagnosis or snap.diagnosis)
    if args.json:
        print(json.dumps({"ok": all(r["ok"] for r in out), "engines": out}, indent=2))
    if any(t is not None and not t.accepted for _, t, _, _ in results):
        return EXIT_REFUSED
    if not all(ok for _, _, ok, _ in results):
        return EXIT_UNREACHABLE if box.controller(gpus[0]).runtime is None else EXIT_FAILED
    return EXIT_OK


def _snap_dict(snap: EngineSnapshot) -> dict[str, Any]:
    d = asdict(snap)
    d["state"] = snap.state.value
    # the JSON keeps its flat pool fields: a deferred sizing has no slots and no slot size yet
    del d["pool"]
    pool = snap.pool if snap.pool is not None and not snap.pool.deferred else None
    d["pool_slots"], d["slot_mib"] = (pool.slots, pool.slot_mib) if pool is not None else (None, None)
    return d


def _status(args: argparse.Namespace, ctl: EngineController, box: BoxGpus | None = None) -> int:
    snap = ctl.snapshot()  # the controller read Docker on construction: this is what Docker shows
    # The pool trace from the run's whole log, as the panel's header follows it (issue 29).
    run_log = run_log_lines(ctl.runtime, snap.container_id, ctl.recent_logs(2000))
    trace = trace_of(run_log)
    alerts = _alerts(ctl, snap, run_log)
    holder = ctl.lock_holder()
    code = EXIT_UNREACHABLE if ctl.runtime is None else STATUS_EXIT.get(snap.state.value, EXIT_FAILED)
    if args.json:
        engines = [r.as_dict() for r in box.rows()] if box is not None else []
        print(json.dumps({"engine": _snap_dict(snap), "engines": engines, "runtime": _runtime_text(ctl),
                          "alerts": alerts,
                          "trace": _trace_dict(trace),
                          "lock": asdict(holder) if holder else None, "exit_code": code}, indent=2))
    else:
        label = " (SIMULATED)" if snap.simulated else ""
        if box is not None and len(box.gpus) > 1:  # one line per GPU; the details below are one GPU's
            for r in box.rows():
                row = r.as_dict()
                print(f"GPU {r.gpu}: {row['state']}{label}  profile: {row['profile'] or '-'}  "
                      f"listens: {row['listens'] or '-'}")
        print(f"engine: {snap.state.value}{label}  profile: {snap.profile_id or '-'}  phase: {snap.phase or '-'}")
        if snap.container_id:
            print(f"build: {snap.build or '-'}  image: {snap.image or '-'}")
        print(f"runtime: {_runtime_text(ctl)}")
        if snap.container_name:
            print(f"container: {snap.container_name}  url: {snap.base_url}  served: {snap.served_name}")
        if snap.pool is not None and snap.pool.slots is not None:
            print(f"FP4 pool: {snap.pool.slots} slots x {snap.pool.slot_mib} MiB")
        if snap.container_id and (line := _trace_line(trace)):
            print(line)
        d = snap.diagnosis
        if snap.message and not (d is not None and d.title.lower() in snap.message.lower()):
            print(f"note: {snap.message}")  # else the diagnosis below says it (issue 29: said twice)
        if (want := ctl.desired()) is not None:  # what the panel's supervisor keeps running (docs/engine.md)
            print(f"should run: {want.key} (set by {want.set_by or '?'} at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(want.since))}); "
                  f"restart policy: {ctl.restart_policy()}")
        if holder is not None:
            print(f"lock: held by {holder.describe()}")
        _print_diag(snap.diagnosis, snap.message)
        for a in alerts:
            print(f"[{a['severity']}] {a['title']}: {a['meaning']} -> {a['action']}")
    return code


def _trace_dict(t: TraceSnapshot) -> dict[str, Any]:
    last = t.primary.last if t.primary else None
    return {"trace_on": t.trace_on, "summaries": t.summaries, "coverage_pct": t.coverage_pct,
            "expert_hit_pct": t.expert_hit_pct, "tick": last.tick if last else None,
            "slots_filled": last.cached if last else None, "slots": last.slots if last else None,
            "understood": t.understood, "unknown_form": t.unknown_form}


def _trace_line(t: TraceSnapshot) -> str:
    """The header's 'Pool coverage' in words: the last `[delta] tick` summary of this run."""
    last = t.primary.last if t.primary else None
    if not t.understood:
        return f"pool coverage: this build's pool trace is not understood ({t.unknown_form})"
    if t.coverage_pct is not None and last is not None:
        return (f"pool coverage: {t.coverage_pct:g}% of tokens, {t.expert_hit_pct:g}% of experts "
                f"({last.cached}/{last.slots} slots, tick {last.tick})")
    if t.trace_on:
        return "pool coverage: no `[delta] tick` summary yet (the trace is on; summaries print only while tokens flow)"
    return ""


def _alerts(ctl: EngineController, snap: EngineSnapshot, run_log: list[str]) -> list[dict[str, Any]]:
    try:
        return [asdict(a) for a in status_alerts(ctl.settings, snap, run_log)]
    except Exception as exc:  # alerts are advisory; status must still print
        return [{"id": "alerts_error", "severity": "info", "title": "alerts unavailable", "meaning": str(exc),
                 "action": "", "evidence": ""}]


def _runtime_text(ctl: EngineController) -> str:
    rt = ctl.runtime
    return rt.describe() if rt is not None else (ctl.runtime_error or "no runtime")


def _preflight(args: argparse.Namespace, ctl: EngineController) -> int:
    report = ctl.preflight(args.profile)
    if args.json:
        print(json.dumps({"ok": report.ok, "items": [asdict(i) for i in report.items]}, indent=2))
    else:
        marks = {"pass": "PASS", "warn": "WARN", "fail": "FAIL"}
        for i in report.items:
            print(f"[{marks[i.status]}] {i.id:<22} {i.title}: {i.detail}")
            if i.status != "pass" and i.fix:
                print(f"       fix: {i.fix}")
        print(report.summary())
    return EXIT_OK if report.ok else EXIT_FAILED


def _start(args: argparse.Namespace, ctl: EngineController) -> int:
    op = ctl.start if args.engine_cmd == "start" else ctl.switch
    ticket = op(args.profile, tuple(args.override), who=oplog.CLI, build=args.build)
    if not ticket.accepted:
        print(ticket.message, file=sys.stderr)
        return EXIT_REFUSED
    if args.no_wait:  # return once the engine exists (the worker thread dies with this process)
        ctl.wait_for(lambda s: s.state.value in ("starting", "ready", "failed") and bool(s.container_id)
                     or ticket.done, timeout=120)
        print(ticket.message if ticket.done else f"{ctl.snapshot().state.value}: {ctl.snapshot().phase}")
        return EXIT_OK if ticket.ok is not False else EXIT_FAILED
    # Follow the controller's change events (docs/engine.md, "events out"), not a poll of the snapshot.
    last = ""
    sub = ctl.subscribe()
    try:
        while not ticket.done:
            ev = sub.get(timeout=0.5)
            if ev is None:
                continue
            line = f"{ev.after.state.value}: {ev.after.phase}"
            if line != last and not args.json:
                print(line, flush=True)
                last = line
    finally:
        sub.close()
    return _report(args, ctl, ticket)


def _stop(args: argparse.Namespace, ctl: EngineController) -> int:
    ticket = ctl.stop(who=oplog.CLI)
    if not ticket.accepted:
        print(ticket.message, file=sys.stderr)
        return EXIT_REFUSED
    ticket.wait()
    return _report(args, ctl, ticket)


def _report(args: argparse.Namespace, ctl: EngineController, ticket: Ticket) -> int:
    snap = ctl.snapshot()
    if args.json:
        print(json.dumps({"ok": ticket.ok, "message": ticket.message, "engine": _snap_dict(snap)}, indent=2))
    else:
        print(ticket.message)
        if not ticket.ok:
            _print_diag(ticket.diagnosis or snap.diagnosis)
    if not ticket.ok and ctl.runtime is None:
        return EXIT_UNREACHABLE
    return EXIT_OK if ticket.ok else EXIT_FAILED


def _print_diag(d: Diagnosis | None, message: str = "") -> None:
    if d is None:
        return
    # the state's message often is the title plus the exit code ("engine stopped outside the panel (exit code 0)")
    title = message if message and d.title.lower() in message.lower() else d.title
    print(f"diagnosis: {title}\n  why: {d.explanation}\n  fix: {d.fix}")
    for e in d.evidence:
        print(f"  log: {e}")


def _logs(args: argparse.Namespace, ctl: EngineController) -> int:
    want = {"both": ("stdout", "stderr")}.get(args.stream, (args.stream,))
    lines = [ln for ln in ctl.recent_logs(100000) if ln.stream in want]
    if not lines and not ctl.snapshot().container_id:
        return _persisted_logs(ctl, args, want)
    for ln in lines[-args.lines:]:
        print(ln.text if args.stream != "both" else f"{ln.stream[3:]} | {ln.text}")
    if not args.follow:
        return EXIT_OK
    done = threading.Event()

    def show(ln: LogLine) -> None:
        if ln.stream in want:
            print(ln.text if args.stream != "both" else f"{ln.stream[3:]} | {ln.text}", flush=True)

    unsubscribe = ctl.add_log_listener(show)
    sub = ctl.subscribe()  # the engine's end arrives as a change event (no snapshot polling)
    try:
        while not done.is_set():
            if ctl.snapshot().state.value in ("stopped", "failed"):
                break
            sub.get(timeout=5.0)
        time.sleep(0.5)  # the last lines of the stopped run are still draining
    finally:
        sub.close()
        unsubscribe()
    return EXIT_OK


def _persisted_logs(ctl: EngineController, args: argparse.Namespace, want: tuple[str, ...]) -> int:
    files = sorted(ctl.logs.directory.glob("*.log"), key=lambda p: p.stat().st_mtime)
    if not files:
        print("no engine is running and no engine log has been saved yet", file=sys.stderr)
        return EXIT_FAILED
    run = files[-1].name.rsplit(".", 2)[0]
    print(f"# no engine running; last saved run: {run}", file=sys.stderr)
    for stream in want:
        p = ctl.logs.directory / f"{run}.{stream}.log"
        if p.exists():
            for text in p.read_text(errors="replace").splitlines()[-args.lines:]:
                print(text if len(want) == 1 else f"{stream[3:]} | {text}")
    return EXIT_OK


def _build_image(args: argparse.Namespace, settings: Settings) -> int:
    eng = settings.recipe.engine
    dockerfile = args.dockerfile or eng.dockerfile
    try:
        src = check_source(Path(args.source) if args.source else None, eng.commit, eng.repo_url, dockerfile,
                           args.allow_other_commit)
    except ImageBuildRefused as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        return EXIT_REFUSED

    def show(ev: BuildEvent) -> None:
        prefix = f"[step {ev.step[0]}/{ev.step[1]}] " if ev.step else ""
        print(prefix + ev.line, file=sys.stderr if ev.error else sys.stdout, flush=True)

    tag = args.tag or eng.image
    try:  # while it builds, a panel waiting for this image retries instead of giving up (docs/engine.md)
        mark = build_mark(settings.state_dir, tag)
    except (LockBusy, OSError) as exc:
        print(f"moet-panel: another build of the engine image runs ({exc})", file=sys.stderr)
        return EXIT_REFUSED
    try:
        result = build_image(src, dockerfile, tag, dict(eng.build_env), show)
    finally:
        mark.release()
    print(result.message, file=sys.stdout if result.ok else sys.stderr)
    return EXIT_OK if result.ok else EXIT_FAILED


def _show_build(ev: BuildEvent) -> None:
    prefix = f"[step {ev.step[0]}/{ev.step[1]}] " if ev.step else ""
    print(prefix + ev.line, file=sys.stderr if ev.error else sys.stdout, flush=True)


def _build_commit(args: argparse.Namespace, settings: Settings) -> int:
    """`build-image --commit REF`: a build the panel holds (docs/engine.md "Upgrading the engine")."""
    from app.backend.engine.builds.job import build_commit, build_demo

    try:
        mark = build_mark(settings.ensure_state_dir(), args.commit)
    except (LockBusy, OSError) as exc:
        print(f"moet-panel: another build of the engine image runs ({exc})", file=sys.stderr)
        return EXIT_REFUSED
    try:
        if settings.recipe.simulated:
            out = build_demo(settings, args.commit, _show_build)
        else:
            out = build_commit(settings, args.commit, Path(args.source) if args.source else None, _show_build,
                               args.dockerfile, args.tag)
    except ImageBuildRefused as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    except ValueError as exc:  # e.g. a SIMULATED variant that does not exist
        print(f"moet-panel: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    finally:
        mark.release()
    print(out.result.message, file=sys.stdout if out.result.ok else sys.stderr)
    if not out.result.ok:  # the operator's log says why (issue 49: `result=failed build=""` and no reason)
        oplog.decision("engine", "build", who=oplog.CLI, ref=args.commit, result="failed", reason=out.result.message)
    if out.build is not None:
        oplog.decision("engine", "build", who=oplog.CLI, build=out.build.id, commit=out.build.commit,
                       image=out.build.image)
        print(f"build {out.build.id}: serve it with `moet-panel engine switch --profile ID --build {out.build.id}`")
    return EXIT_OK if out.result.ok else EXIT_FAILED


def _builds(args: argparse.Namespace, settings: Settings) -> int:
    from app.backend.engine.builds import store as builds

    views = builds.registry(settings).views()
    if args.json:
        print(json.dumps([{**asdict(v.build), "current": v.current} for v in views], indent=2))
        return EXIT_OK
    print(f"{'':2}{'ID':<10}{'COMMIT':<14}{'IMAGE':<40}{'SIZE':>9}  {'BUILT':<17}EVIDENCE")
    for v in views:
        b = v.build
        size = f"{b.size_bytes / 2**20:.0f} MiB" if b.size_bytes else "-"
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(b.built_at)) if b.built_at else "(recipe pin)"
        ev = ", ".join(f"{e.kind} {e.ref}" for e in b.evidence if e.kind in ("selftest", "abtest")) or "-"
        sim = " SIMULATED" if b.simulated else ""
        print(f"{'*' if v.current else ' ':2}{b.id:<10}{b.commit[:12]:<14}{b.image:<40}{size:>9}  {when:<17}{ev}{sim}")
    return EXIT_OK


def _promote(args: argparse.Namespace, ctl: EngineController) -> int:
    from app.backend.engine import upgrade

    try:
        out = (upgrade.promote(ctl, args.build_id, oplog.CLI) if args.engine_cmd == "promote"
               else upgrade.rollback(ctl, oplog.CLI))
    except (ValueError, OSError) as exc:
        print(f"moet-panel: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"current build: {out.current} (was {out.previous})")
    if out.ticket is None:
        print("the next start runs it")
        return EXIT_OK
    if not out.ticket.accepted:
        print(f"the engine was not switched: {out.ticket.message}", file=sys.stderr)
        return EXIT_FAILED
    out.ticket.wait()
    return _report(args, ctl, out.ticket)
