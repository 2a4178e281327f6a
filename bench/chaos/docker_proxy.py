"""A Docker socket proxy that a test or the chaos soak can cut, restore and slow down (issue 39, item 7).

    .venv/bin/python -m bench.chaos.docker_proxy ~/moet-chaos/docker.sock [--delay 10]   # by hand
    DOCKER_HOST=unix://$HOME/moet-chaos/docker.sock moet-panel serve --demo

It listens on a unix socket and copies bytes both ways to the real daemon's socket (/var/run/docker.sock):
it never parses HTTP, so streams (`docker events`, log follows) and hijacked connections (attach, exec) pass
unchanged, half-closes included. Three faults, switchable at any time from any thread:

* `cut()` — "Docker away", as during a daemon restart: every open connection is closed and nobody is
  listening any more (a connect gets ECONNREFUSED, the socket file stays, as dockerd's does);
* `restore()` — listening again;
* `set_delay(s)` — every chunk the daemon sends is held `s` seconds before it reaches the client (a slow or
  wedged daemon: a request's reply comes `s` late, a stream lags `s`). `held()` is how many chunks are held
  right now: a test can prove that a caller returned while a Docker reply was still on its way.

The proxy runs its own asyncio loop in a daemon thread (`start()` / `stop()`, or a `with` block).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from types import TracebackType

UPSTREAM = "/var/run/docker.sock"
CHUNK = 65536


class _Conn:
    """One client connection and its upstream twin."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []

    def close(self) -> None:
        for w in (self.client, self.upstream):
            if w is not None:
                w.close()
        for t in self.tasks:
            t.cancel()


class DockerProxy:
    def __init__(self, path: Path | str, upstream: str = UPSTREAM) -> None:
        self.path = Path(path)
        self.upstream = upstream
        self.delay_s = 0.0
        self.connections_total = 0
        self.delivered_total = 0  # chunks handed to clients (a test sees whether a reply arrived)
        self._held = 0
        self._conns: set[_Conn] = set()
        self._server: asyncio.AbstractServer | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="docker-proxy", daemon=True)

    # -- public, thread-safe ---------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The DOCKER_HOST value that reaches Docker through this proxy."""
        return f"unix://{self.path}"

    def start(self) -> DockerProxy:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        self.restore()
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        self.cut()
        self._call(self._cancel_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
        self.path.unlink(missing_ok=True)

    def cut(self) -> None:
        """Docker away: close every connection and stop listening (connects are refused)."""
        self._call(self._cut())

    def restore(self) -> None:
        """Docker back: listen again (no effect while listening)."""
        self._call(self._listen())

    def set_delay(self, seconds: float) -> None:
        """Hold every chunk from the daemon this long (0: pass straight through). Applies to chunks read
        from now on."""
        self.delay_s = max(0.0, float(seconds))

    @property
    def listening(self) -> bool:
        return self._server is not None

    def held(self) -> int:
        """Chunks read from the daemon and not yet given to their client (only ever > 0 with a delay)."""
        return self._held

    def active(self) -> int:
        """Open client connections."""
        return len(self._conns)

    def __enter__(self) -> DockerProxy:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- the loop's side -------------------------------------------------------------------------
    def _call(self, coro: Coroutine[object, object, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _listen(self) -> None:
        if self._server is not None:
            return
        self.path.unlink(missing_ok=True)  # a stale file from a cut or an earlier run
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.path))
        os.chmod(self.path, 0o660)

    async def _cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()  # the file stays (3.11 does not remove it): connects get ECONNREFUSED
        for c in list(self._conns):
            c.close()
        self._conns.clear()

    async def _cancel_all(self) -> None:
        """After a cut: let each connection's handler end (a cancelled handler makes asyncio's stream
        protocol log a CancelledError)."""
        me = asyncio.current_task()
        tasks = [t for t in asyncio.all_tasks() if t is not me]
        if tasks:
            await asyncio.wait(tasks, timeout=2)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:  # accepted in the instant of a cut
            writer.close()
            return
        conn = _Conn(writer)
        self._conns.add(conn)
        self.connections_total += 1
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
        except OSError:
            writer.close()
            self._conns.discard(conn)
            return
        conn.upstream = up_writer
        down = asyncio.ensure_future(self._down(up_reader, writer))
        up = asyncio.ensure_future(self._pump(reader, up_writer))
        conn.tasks = [down, up]
        try:
            await asyncio.gather(down, up, return_exceptions=True)
        finally:
            conn.close()
            self._conns.discard(conn)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Client to daemon, as is; EOF from the client is passed on as a half-close."""
        try:
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            writer.close()

    async def _down(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Daemon to client, each chunk held `delay_s` from when it was read (order kept; a stream lags, it
        does not stall cumulatively)."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                try:
                    wait = due - time.monotonic()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    if not data:
                        if writer.can_write_eof():
                            writer.write_eof()
                        return
                    if writer.is_closing():  # the client gave up waiting (its own timeout): nothing reaches it
                        return
                    writer.write(data)
                    await writer.drain()
                    self.delivered_total += 1
                finally:
                    self._held -= 1

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(CHUNK)
                self._held += 1
                queue.put_nowait((time.monotonic() + self.delay_s, data))
                if not data:
                    break
            await sender
        except (OSError, RuntimeError):
            writer.close()
        finally:
            if not sender.done():
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
            while not queue.empty():  # dropped by a cut: no longer held
                queue.get_nowait()
                self._held -= 1


def main() -> int:
    ap = argparse.ArgumentParser(description="Docker socket proxy (cut with SIGUSR1, restore with SIGUSR2)")
    ap.add_argument("path", help="unix socket to listen on")
    ap.add_argument("--upstream", default=UPSTREAM)
    ap.add_argument("--delay", type=float, default=0.0, help="hold every reply this many seconds")
    args = ap.parse_args()
    import signal

    proxy = DockerProxy(Path(args.path).expanduser(), args.upstream).start()
    proxy.set_delay(args.delay)
    signal.signal(signal.SIGUSR1, lambda *_: proxy.cut())
    signal.signal(signal.SIGUSR2, lambda *_: proxy.restore())
    print(f"DOCKER_HOST={proxy.url} (delay {proxy.delay_s:g} s; kill -USR1 {os.getpid()} cuts, -USR2 restores)",
          flush=True)
    try:
        signal.pause()
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
