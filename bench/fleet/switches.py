"""Benchmark: each box of the namespaced fleet switches profile in turn while 3 clients call in a loop through the
front (issue 51's "0 refused, 0 cut", docs/fleet.md#the-fault-table). bench/fleet/run.py switches one box once;
this one switches many times, where a failure in a few hundred requests shows. `--what upgrade`: each box in turn
upgraded to the SIMULATED candidate build `next` (built and promoted, simbox.py `upgrade`), then rolled back.

    .venv/bin/python bench/fleet/switches.py [--switches 12] [--what switch|upgrade] [--tokens 10] [--tok-s 100]

Prints per switch and in total: requests, refused (an HTTP error status, or no answer), cut (a stream without its
end), and of the failures those ended by the front's 10 s silence bound ("silent") or by a box closing mid-answer
("closed"). Everything it starts is removed at the end, even on failure (bench/fleet/netboxes.py).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.fleet.netboxes import Fleet  # noqa: E402
from bench.fleet.run import Client, Result, loop, summary  # noqa: E402


def counts(rs: list[Result]) -> dict[str, int]:
    return {"requests": len(rs), "refused": sum(1 for r in rs if r.status != 200),
            "cut": sum(1 for r in rs if r.status == 200 and not r.ok),
            "silent": sum(1 for r in rs if "nothing came from upstream" in r.error),
            "closed": sum(1 for r in rs if "closed the connection" in r.error)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--switches", type=int, default=12)
    ap.add_argument("--what", choices=["switch", "upgrade"], default="switch",
                    help="a profile switch, or an upgrade to the SIMULATED candidate build `next` and its rollback")
    ap.add_argument("--tokens", type=int, default=10, help="each answer's tokens")
    ap.add_argument("--tok-s", type=float, default=100.0, help="each SIMULATED engine's decode rate")
    args = ap.parse_args()
    t0 = time.monotonic()
    total = counts([])
    with Fleet(3, decode_tok_s=args.tok_s) as f:
        f.start()
        key = f.cli("keys", "create", "bench").stdout.split()[0]
        f.enter_front()
        c = Client(f.front_url, key, timeout_s=40)
        print(f"fleet serving in {time.monotonic() - t0:.1f} s", flush=True)
        for i in range(args.switches):
            box = f.boxes[i % len(f.boxes)]
            there = (i // len(f.boxes)) % 2 == 0
            cmd, want = ((f"switch {'balanced' if there else 'quality'}", "switched") if args.what == "switch" else
                         ("upgrade next" if there else "rollback", "upgraded"))
            rs = loop(c, args.tokens, 3, lambda b=box, cmd=cmd, want=want: b.command(cmd, want))
            total = {k: total[k] + v for k, v in counts(rs).items()}
            print(f"{args.what} {i + 1}: {box.name} {cmd}: {summary(rs)}", flush=True)
    print(f"total: {total} (goal: 0 refused, 0 cut); bench took {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
