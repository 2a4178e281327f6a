"""Benchmark: a SIMULATED box of several GPUs behind the gateway (issue 43), on the real Docker.

    .venv/bin/python bench/gpus/box.py [--gpus 2] [--tokens 60] [--loop-s 0]

One engine per GPU (the SIMULATED engine, the card's `--max-num-seqs 1`, one container per GPU), driven by the
panel's own BoxGpus (app/backend/engine/gpus.py) in this process; the gateway (in this process, as the panel's
child would run it) reads the box's status from the controllers' snapshots (routing.BoxSource) and counts
its answers per GPU for each engine's drain. Prints:

* one answer of --tokens alone, then --gpus answers at once through the gateway: the ratio (goals: 2 at once
  ≤ 1.2× one; 4 at once ≤ 1.3×) and the GPU each answered on;
* a rolling `switch --profile balanced` of every GPU while a client calls in a loop through the gateway:
  requests refused (non-200) or cut (no [DONE]), and the seconds no GPU served (sampled every 20 ms).
* with --gpus 3 or more (`--ab`): GPU 0 back on quality, then a blind A/B of quality (GPU 0) vs balanced (GPU 1)
  side by side while the client keeps calling: engine switches during the A/B, the GPUs that answered the
  client meanwhile (goal: only the others), refused/cut requests.

Everything it starts (containers, data dir under $HOME) is removed at the end, even on failure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.panelproc import recipe_copy  # noqa: E402

MODEL = "deepseek-v4-flash"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=60)
    ap.add_argument("--no-roll", action="store_true", help="only the answers-at-once figures")
    ap.add_argument("--ab", action="store_true", help="the side-by-side A/B phase (needs --gpus 3 or more)")
    args = ap.parse_args()
    os.environ["MOET_PANEL_SIM_GPUS"] = str(args.gpus)
    os.environ["MOET_PANEL_GPU"] = "simulated"

    import httpx

    from app.backend.state import make_box_gpus
    from app.backend.engine.lifecycle.tickets import ControllerOptions
    from app.backend.gateway.keys import KeyStore
    from app.backend.gateway.proxy import GPU_HEADER, Limits
    from app.backend.gateway.engine_status import SnapshotSource
    from app.backend.gateway.routing import BoxSource
    from app.backend.gateway.server import GatewayConfig, GatewayServer, engine_slots_of
    from app.backend.config.settings import resolve_settings
    from app.backend.telemetry.gpu import box_gpu_count, follow_engine, make_gpu_reader

    data = Path.home() / f"moet-bench-gpus-{os.getpid()}"
    data.mkdir(parents=True)
    rid = f"bench-gpus-{os.getpid()}"
    recipe, _ = recipe_copy(ROOT, data, rid, boot_s="2")
    settings = resolve_settings(recipe, data / "d", demo=True)
    settings.ensure_state_dir()
    reader = make_gpu_reader(settings)
    box = make_box_gpus(settings, reader, box_gpu_count(reader), lambda gpu: ControllerOptions(actor="CLI"))
    for g in box.gpus:
        follow_engine(reader, box.controller(g), g)
    keys = KeyStore(settings.state_dir)
    server = None
    try:
        t0 = time.monotonic()
        started = box.start("quality", box.gpus)
        for _, t in started:
            t.wait(180)
        print(f"box: {len(box.gpus)} SIMULATED GPUs, engines ready on {box.serving()} in "
              f"{time.monotonic() - t0:.1f} s")
        slots_for = lambda pid: engine_slots_of(settings.recipe, next(  # noqa: E731
            (p for p in settings.recipe.profiles if p.id == pid), None))
        source = BoxSource([SnapshotSource(box.controller(g).snapshot, "http://127.0.0.1:9", slots_for, gpu=g)
                              for g in box.gpus], left_out_fn=box.left_out)
        server = GatewayServer(GatewayConfig(host="127.0.0.1", port=0, limits=Limits(rate_per_min=100000.0)),
                               keys, source)  # the bench is one key calling in a loop: no per-key rate cap
        server.start()
        assert server.wait_started(10), server.error
        app = server.app
        for g in box.gpus:  # each engine's drain waits for the gateway's answers on that GPU

            class _Count:
                def __init__(self, gpu: int) -> None:
                    self.gpu = gpu

                def answers_in_flight(self) -> int:
                    return app.answers_in_flight_on(self.gpu)

            box.controller(g).add_answer_counter(_Count(g))
        key = keys.create("bench").key
        url = f"http://127.0.0.1:{server.port}/v1/chat/completions"
        client = httpx.Client(timeout=120, headers={"Authorization": f"Bearer {key}"})

        def ask(n: int) -> tuple[int, bool, str, float]:
            """(status, the stream ended with [DONE], GPU that answered, seconds)."""
            t = time.monotonic()
            body = {"model": MODEL, "messages": [{"role": "user", "content": "tell me about experts"}],
                    "max_tokens": n, "ignore_eos": True, "stream": True}
            try:
                with client.stream("POST", url, json=body) as r:
                    text = "".join(r.iter_text())
                    return r.status_code, "[DONE]" in text, r.headers.get(GPU_HEADER.decode(), "?"), time.monotonic() - t
            except httpx.HTTPError:
                return 599, False, "?", time.monotonic() - t

        ask(4)  # warm the connections
        one = min(ask(args.tokens)[3] for _ in range(2))
        results: list[tuple[int, bool, str, float]] = []
        threads = [threading.Thread(target=lambda: results.append(ask(args.tokens))) for _ in box.gpus]
        t = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        together = time.monotonic() - t
        print(f"one answer of {args.tokens} tokens: {one:.2f} s; {len(box.gpus)} at once: {together:.2f} s "
              f"= {together / one:.2f}x (goal ≤ {1.2 if len(box.gpus) <= 2 else 1.3}x); "
              f"GPUs that answered: {sorted(r[2] for r in results)}; statuses {sorted(r[0] for r in results)}")
        if args.no_roll:
            return 0
        stop = threading.Event()
        loop: list[tuple[int, bool, str, float]] = []
        gaps = {"none_s": 0.0}

        def caller() -> None:
            while not stop.is_set():
                loop.append(ask(20))

        def sampler() -> None:
            last = time.monotonic()
            while not stop.is_set():
                time.sleep(0.02)
                now = time.monotonic()
                if not source.status().accepts:
                    gaps["none_s"] += now - last
                last = now

        bg = [threading.Thread(target=caller), threading.Thread(target=sampler)]
        for th in bg:
            th.start()
        t = time.monotonic()
        steps = box.rolling_switch("balanced", box.gpus, timeout_s=180)
        roll = time.monotonic() - t
        time.sleep(1.0)  # a last few calls after the roll
        stop.set()
        for th in bg:
            th.join()
        refused = sum(1 for s, _, _, _ in loop if s != 200)
        codes = sorted({s for s, _, _, _ in loop if s != 200})
        cut = sum(1 for s, done, _, _ in loop if s == 200 and not done)
        by_gpu = {g: sum(1 for r in loop if r[2] == str(g)) for g in box.gpus}
        print(f"rolling switch to balanced: {roll:.1f} s, steps ok {[s.ok for s in steps]}; "
              f"profiles now {[r.snapshot.profile_id for r in box.rows()]}")
        print(f"client loop: {len(loop)} requests, refused {refused}{f' {codes}' if codes else ''}, cut {cut}; answered per GPU {by_gpu}; "
              f"no GPU serving for {gaps['none_s']:.2f} s")
        if args.ab and len(box.gpus) >= 3:
            ab_phase(box, settings, ask)
        return 0
    finally:
        if server is not None:
            server.stop()
        for _, t in box.stop(box.gpus):
            t.wait(60)
        box.close()
        keys.close()
        import docker

        dc = docker.from_env()
        for c in dc.containers.list(all=True, filters={"label": [f"moet-panel.recipe={rid}"]}):
            c.remove(force=True)
        shutil.rmtree(data, ignore_errors=True)


def ab_phase(box: object, settings: object, ask: object) -> None:
    """A on GPU 0 (quality), B on GPU 1 (balanced), both at once, while a client calls through the gateway."""
    from app.backend.abtest.journal import new_spec
    from app.backend.abtest.runner import ABRunService
    from app.backend.engine.gpus import BoxGpus

    assert isinstance(box, BoxGpus)
    ask_fn = ask  # (n) -> (status, done, gpu, seconds)
    c0, c1 = box.controller(0), box.controller(1)
    for t in (c0.switch("quality"),):
        t.wait(180)
    switches: list[str] = []
    for g in (0, 1):
        box.controller(g).add_op_listener(lambda t, g=g: switches.append(f"GPU {g}: {t.action}"))
    svc = ABRunService(settings, c0, engine_for=lambda side: c0 if side == "A" else c1,  # type: ignore[arg-type]
                       on_sides=lambda on: box.leave_out([0, 1], "blind A/B") if on else box.take_back([0, 1]))
    stop = threading.Event()
    during: list[tuple[int, bool, str, float]] = []

    def caller() -> None:
        while not stop.is_set():
            r = ask_fn(20)  # type: ignore[operator]
            if box.left_out():
                during.append(r)

    th = threading.Thread(target=caller)
    th.start()
    t = time.monotonic()
    spec = new_spec("quality", "balanced", ["Explain a lock-free queue.", "Explain Raft."], [1, 2], 48)
    svc.start(spec)
    p = svc.wait(300)
    took = time.monotonic() - t
    stop.set()
    th.join()
    refused = sum(1 for r in during if r[0] != 200)
    cut = sum(1 for r in during if r[0] == 200 and not r[1])
    print(f"blind A/B quality (GPU 0) vs balanced (GPU 1): {p.state.value} in {took:.1f} s, {p.done}/{p.total} "
          f"answers; engine switches during it: {len(switches)} {switches}; client meanwhile: {len(during)} "
          f"requests on GPUs {sorted({r[2] for r in during})}, refused {refused}, cut {cut}")


if __name__ == "__main__":
    raise SystemExit(main())
