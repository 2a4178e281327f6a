"""Decompress through the `zstd` CLI in its own process (a second core, no GIL), fed verified bytes.

Measured on the 2-core build box, 3 GiB of tar: python-zstandard's stream_reader 7.2 s, `zstd -d`
5.2 s — and the CLI runs beside the Python tar writer instead of sharing its interpreter. It only
ever sees parts that already passed sha256; tar parsing and every safety check stay in Python.
Unlike `stream_reader`, the CLI also rejects a truncated final frame (non-zero exit).
"""

from __future__ import annotations

import fcntl
import io
import shutil
import subprocess
import threading

import zstandard

FEED_CHUNK = 1 << 20
PIPE_SIZE = 1 << 20
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)


def zstd_cli() -> str | None:
    return shutil.which("zstd")


class NativeZstd:
    """`readinto()` over `zstd -d -c`; a feeder thread copies `source` to its stdin.

    Raises zstandard.ZstdError when zstd fails (corrupt or truncated input), or the feeder's own
    exception (e.g. Stopped while waiting for the next verified part).
    """

    def __init__(self, source: io.RawIOBase, exe: str) -> None:
        self.proc = subprocess.Popen([exe, "-d", "-c", "-q", "--no-progress"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:  # bigger pipes: fewer wake-ups per GiB (best effort, Linux only)
                fcntl.fcntl(pipe.fileno(), F_SETPIPE_SZ, PIPE_SIZE)
            except OSError:
                pass
        self.feed_error: BaseException | None = None
        self.feeder = threading.Thread(target=self._feed, args=(source,), name="zstd-feed", daemon=True)
        self.feeder.start()

    def _feed(self, source: io.RawIOBase) -> None:
        stdin = self.proc.stdin
        try:
            buf = bytearray(FEED_CHUNK)
            view = memoryview(buf)
            while True:
                n = source.readinto(buf)
                if not n:
                    break
                stdin.write(view[:n])
        except BrokenPipeError:
            pass  # zstd exited early (bad input): its exit status tells why
        except BaseException as exc:  # handed to the reader
            self.feed_error = exc
            self.proc.kill()
        finally:
            try:
                stdin.close()
            except OSError:
                pass

    def readinto(self, buf: bytearray) -> int:
        """Fill buf (fewer bytes only at the end of the stream); 0 = end, after checking zstd's status."""
        view, n = memoryview(buf), 0
        while n < len(buf):
            k = self.proc.stdout.readinto(view[n:])
            if not k:
                break
            n += k
        if n == 0:
            self._check_exit()
        return n

    def _check_exit(self) -> None:
        self.feeder.join()
        rc = self.proc.wait()
        if self.feed_error is not None:
            raise self.feed_error
        if rc != 0:
            err = self.proc.stderr.read().decode(errors="replace").strip().splitlines()
            raise zstandard.ZstdError(f"zstd -d exited {rc}: {err[-1] if err else 'no message'}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdout, self.proc.stderr):
            pipe.close()

    def __enter__(self) -> "NativeZstd":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
