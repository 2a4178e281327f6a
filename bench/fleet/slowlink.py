"""A slow link without netem: a TCP relay that delays every chunk of the byte stream by D ms in each direction,
keeping its order (bench/fleet/netboxes.py `Fleet(relays=True)`, `Fleet.slow_link`; docs/fleet.md "Not done yet":
this machine's kernel has no `sch_netem`).

    ip netns exec NS python -m bench.fleet.slowlink --listen ADDR:PORT --to ADDR:PORT [--delay-ms 0]

It sits in the path from the start (a delay of 0 passes bytes on as they come), so a delay set later acts on the
connections already open too, as netem does: stdin `delay MS` sets it and answers {"delay_ms": MS, "relayed": {...}}
with what it carried since the last such line (connections opened, bytes each way).

Per connection, one task per direction reads what arrives and queues it as (due time, bytes); another writes each
chunk when it is due, in order. An end of stream (or a reset) is passed on D ms later, as the last chunk. What differs
from netem: the delay is on the byte stream in user space, per chunk read, not per packet — the TCP handshake and
ACKs of each leg are not delayed (a new connection is accepted at once; its first bytes wait D ms), and a chunk is
whatever one read returned. Prints {"relaying": "ADDR:PORT"} once it listens (bytes_in: towards --to); ends on SIGTERM or stdin's end.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import signal
import sys
import threading


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: dict[str, float],
               counted: dict[str, int], way: str) -> None:
    """`reader`'s bytes to `writer`, each chunk D later than it came; the end of stream last, D later too."""
    loop = asyncio.get_running_loop()
    queue: collections.deque[tuple[float, bytes]] = collections.deque()
    arrived = asyncio.Event()

    async def read() -> None:
        try:
            while True:
                data = await reader.read(65536)
                queue.append((loop.time() + delay["s"], data))
                arrived.set()
                if not data:
                    return
        except (ConnectionError, OSError):
            queue.append((loop.time() + delay["s"], b""))
            arrived.set()

    async def write() -> None:
        try:
            while True:
                while not queue:
                    arrived.clear()
                    await arrived.wait()
                due, data = queue.popleft()
                await asyncio.sleep(max(0.0, due - loop.time()))
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                counted[way] += len(data)
                await writer.drain()
        except (ConnectionError, OSError):
            return

    reading = asyncio.create_task(read())
    try:
        await write()
    finally:
        reading.cancel()


def zero() -> dict[str, int]:
    return {"connections": 0, "bytes_in": 0, "bytes_out": 0}


async def serve(listen: tuple[str, int], to: tuple[str, int], delay_s: float) -> None:
    counted = zero()
    delay = {"s": delay_s}  # read by every chunk as it arrives: a change acts on open connections at once

    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        counted["connections"] += 1
        try:
            u_reader, u_writer = await asyncio.open_connection(*to)
        except OSError:
            c_writer.close()
            return
        try:
            await asyncio.gather(pipe(c_reader, u_writer, delay, counted, "bytes_in"),
                                 pipe(u_reader, c_writer, delay, counted, "bytes_out"))
        finally:
            for w in (c_writer, u_writer):
                w.close()

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def command(line: str) -> None:
        cmd = line.split()
        if len(cmd) == 2 and cmd[0] == "delay":
            delay["s"] = float(cmd[1]) / 1000
            print(json.dumps({"delay_ms": float(cmd[1]), "relayed": dict(counted)}), flush=True)
            counted.update(zero())

    def commands() -> None:  # stdin in a thread of its own; each line handled on the loop
        for line in sys.stdin:
            loop.call_soon_threadsafe(command, line)
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=commands, daemon=True).start()
    print(json.dumps({"relaying": f"{listen[0]}:{listen[1]}", "to": f"{to[0]}:{to[1]}", "delay_s": delay_s}),
          flush=True)
    async with server:
        await stop.wait()


def hostport(s: str) -> tuple[str, int]:
    host, _, port = s.rpartition(":")
    return host, int(port)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", required=True, type=hostport, metavar="ADDR:PORT")
    ap.add_argument("--to", required=True, type=hostport, metavar="ADDR:PORT")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="each direction's delay at first")
    args = ap.parse_args()
    asyncio.run(serve(args.listen, args.to, args.delay_ms / 1000))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
