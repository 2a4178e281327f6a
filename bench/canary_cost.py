#!/usr/bin/env python3
"""What the generation canary costs a user (issue 32): decode tok/s and time to first token of user requests
with the canary on vs off, alternating rounds on ONE SIMULATED engine (real Docker, `--max-num-seqs 1`, so a
canary in flight would make a user's request wait), same run.

    .venv/bin/python bench/canary_cost.py [--rounds 3] [--requests 8] [--interval 1.0] [--max-tokens 64]

Users arrive with random idle gaps around the canary interval (so canaries do fire between them), each asks
for `--max-tokens` tokens, streamed with the real `openai` client. Prints the median decode tok/s per side,
the ratio (goal >= 99.5 %), TTFT median / max per side, and the largest TTFT beyond the canary-off median
("max wait behind a canary"). Then the worst case on purpose: `--collisions` user requests fired the moment a
canary is in flight (`EngineController.canary_in_flight`), their TTFT against the canary-off median. The
canary interval is set far below the recipe's default (30 s) to make
collisions likely. Noisy on a shared 2-core box: read the ratio with the spread.
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import docker  # noqa: E402
import httpx2  # noqa: E402 - the openai SDK's HTTP client
import openai  # noqa: E402

from app.backend.engine.runtime.client import EngineEndpoint, api_base  # noqa: E402
from app.backend.engine.controller import ControllerOptions, EngineController  # noqa: E402
from app.backend.engine.runtime.docker import DockerRuntime  # noqa: E402
from app.backend.recipe import SIMULATED_RECIPE, load_recipe  # noqa: E402
from app.backend.config.settings import Settings  # noqa: E402
from app.backend.simengine.image import content_tag, ensure_image  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def settings_for(tmp: Path, image: str) -> Settings:
    port = free_port()
    r = load_recipe(SIMULATED_RECIPE)
    args = list(r.serve.args)
    args[args.index("--port") + 1] = str(port)
    r = r.model_copy(update={"id": f"canary-{port}", "serve": r.serve.model_copy(update={"port": port, "args": args}),
                             "engine": r.engine.model_copy(update={"image": image, "stop_grace_s": 5})})
    return Settings(SIMULATED_RECIPE, r, tmp, True)


def one_request(client: openai.OpenAI, model: str, max_tokens: int) -> tuple[float, float]:
    """(ttft_s, decode tok/s) of one streamed completion."""
    t0 = time.monotonic()
    first = last = None
    n = 0
    stream = client.completions.create(model=model, prompt="Tell me about the sea.", max_tokens=max_tokens,
                                       stream=True, extra_body={"ignore_eos": True})
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            now = time.monotonic()
            first = first if first is not None else now
            last = now
            n += 1
    assert first is not None and last is not None and n > 1
    return first - t0, (n - 1) / (last - first)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--collisions", type=int, default=10)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    dclient = docker.from_env()
    image = ensure_image(dclient, tag=content_tag())
    with tempfile.TemporaryDirectory(prefix="canary-cost-") as tmp:
        st = settings_for(Path(tmp), image)
        opts = ControllerOptions(extra_env={"MOET_SIM_BOOT_S": "1"}, extra_labels={"moet-panel.test": "1"},
                                 supervise=True, canary_interval_s=args.interval, canary_timeout_s=5.0)
        ctl = EngineController(st, DockerRuntime(dclient), options=opts)
        results: dict[str, list[tuple[float, float]]] = {"on": [], "off": []}
        try:
            assert ctl.start("quality").wait(120) and ctl.snapshot().is_ready, ctl.snapshot().message
            snap = ctl.snapshot()
            # the openai SDK over the engine's unix socket (issue 40, docs/engine.md "Where the engine listens")
            uds = httpx2.Client(transport=httpx2.HTTPTransport(uds=EngineEndpoint.parse(snap.base_url).uds))
            client = openai.OpenAI(base_url=api_base(snap.base_url), api_key="none", max_retries=0, http_client=uds)
            for r in range(args.rounds):
                for side in (("on", "off") if r % 2 == 0 else ("off", "on")):
                    ctl.set_canary_interval(args.interval if side == "on" else 0.0)
                    for _ in range(args.requests):
                        time.sleep(rng.uniform(0.8, 3.0) * args.interval)  # idle gap: the canary's chance
                        results[side].append(one_request(client, snap.served_name, args.max_tokens))
            collide: list[float] = []
            ctl.set_canary_interval(0.3)
            for _ in range(args.collisions):
                if not ctl.canary_in_flight.wait(10):
                    break
                collide.append(one_request(client, snap.served_name, 8)[0])
                time.sleep(0.4)
            sent, yielded, _ = ctl.canary_counts()
        finally:
            ctl.stop().wait(60)
            ctl.close()
            for c in dclient.containers.list(all=True, filters={"label": f"moet-panel.recipe={st.recipe.id}"}):
                c.remove(force=True)
    on_tps = statistics.median(t for _, t in results["on"])
    off_tps = statistics.median(t for _, t in results["off"])
    on_ttft = [t for t, _ in results["on"]]
    off_ttft = [t for t, _ in results["off"]]
    base = statistics.median(off_ttft)
    print(f"rounds {args.rounds} x {args.requests} requests per side, {args.max_tokens} tokens each, canary every "
          f"{args.interval:g} s while idle (recipe default 30 s); canaries sent {sent}, yielded to a user {yielded}")
    print(f"decode tok/s, median: canary on {on_tps:.2f}, off {off_tps:.2f} -> {100 * on_tps / off_tps:.2f} % "
          f"(goal >= 99.5 %); spread on {min(t for _, t in results['on']):.2f}-{max(t for _, t in results['on']):.2f}"
          f", off {min(t for _, t in results['off']):.2f}-{max(t for _, t in results['off']):.2f}")
    print(f"TTFT median / max: canary on {statistics.median(on_ttft) * 1000:.0f} / {max(on_ttft) * 1000:.0f} ms, "
          f"off {base * 1000:.0f} / {max(off_ttft) * 1000:.0f} ms")
    print(f"max wait behind a canary (TTFT beyond the canary-off median): {(max(on_ttft) - base) * 1000:.0f} ms "
          f"(the same figure with the canary off: {(max(off_ttft) - base) * 1000:.0f} ms)")
    if collide:
        print(f"fired while a canary was in flight ({len(collide)} requests): TTFT median "
              f"{statistics.median(collide) * 1000:.0f} ms, max {max(collide) * 1000:.0f} ms -> wait beyond the "
              f"canary-off median: max {(max(collide) - base) * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
