"""Streaming extraction: verified parts (in order) -> python-zstandard -> tarfile "r|" -> files.

Member by member, each checked by safety.check_member and PEP 706's data filter. Regular files are
written by us (large writes, holes kept for sparse members) to `.<name>.moet-partial` and renamed
into place when complete, so a half-written file never carries its final name. A file already
complete from an earlier run (journal + same size on disk) is not rewritten.

With a `CommitGate` the input may be read before it is verified (chain.py decodes a part while it
arrives): a member is then renamed into place, and reported, only once every input byte read before
its last byte was decoded is verified; members land in archive order (docs/downloads.md, "Decoded
as it arrives"). Without one, each lands as soon as it is written.

Decompression runs in-process (libzstd releases the GIL): a `zstd -d` child process costs two more
copies of every byte through pipes (docs/downloads.md, "Measurements behind the code").
python-zstandard returns a short stream, silently, when the input is truncated (docs/downloads.md,
"Complete or an error"), so completeness is checked at the tar level instead: the stream must reach
tar's end-of-archive block, and a member cut short is a tarfile error.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import errno
import io
import logging
import os
import queue
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Protocol, TypeVar, cast

import zstandard

from app.backend import oplog
from app.backend.download.safety import apply_data_filter, check_member
from app.backend.download.types import DownloadError, Limit, SpaceError, Stopped, UnsafeArchiveError

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

T = TypeVar("T")

COPY_CHUNK = 4 << 20
WRITE_SLICE = 256 << 10
READ_SIZE = 4 << 20  # compressed bytes per read of the mapped parts: few GIL round trips for the decompressor
TAR_BUFSIZE = 512  # tarfile reads only headers itself (no read-ahead), so data can bypass it
DECODE_CHUNK = 1 << 20  # one decompressed buffer
QUEUE_CHUNKS = 4  # decompressed buffers between the decoder and the writer: 4 MiB per artifact
WRITEBACK_EVERY = 8 << 20  # start the disk's writeback of a file after this many bytes written to it
SYNC_FILE_RANGE_WRITE = 2
JOIN_S = 30.0  # the decoding thread's waits all poll a stop at least every 0.5 s: this is never reached


class Writeback:
    """Starts the kernel's writeback of a file's dirty pages as they are written, without waiting.

    The kernel starts writing dirty pages only past dirty_background_ratio (10 % of RAM) or after 30 s,
    so on a large host the card's `curl | zstd | tar` keeps what it extracted dirty until its final
    sync, and the disk works alone at the end.
    `sync_file_range(SYNC_FILE_RANGE_WRITE)` every WRITEBACK_EVERY bytes keeps the disk busy beside
    the decoder; the durability threads' fsync of a finished file then waits only for its tail
    (docs/downloads.md, "Three artifacts at once"). A no-op where libc lacks the call.
    """

    def __init__(self) -> None:
        self._call = _sync_file_range()
        self._pending: dict[int, int] = {}

    def wrote(self, fd: int, n: int) -> None:
        if self._call is None:
            return
        pending = self._pending.get(fd, 0) + n
        if pending >= WRITEBACK_EVERY:
            self._call(fd, 0, 0, SYNC_FILE_RANGE_WRITE)  # offset 0, length 0: every dirty page of the file
            pending = 0
        self._pending[fd] = pending

    def closed(self, fd: int) -> None:
        self._pending.pop(fd, None)


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    call.restype = ctypes.c_int
    return call


class CommitGate(Protocol):
    """Positions in the input stream (bytes read from it so far) and how far it is verified."""

    def position(self) -> int:
        """Input bytes read so far (called by the decoding thread after each decoded buffer)."""

    def verified(self) -> int:
        """Input bytes verified, from the start. May raise: input already read failed verification."""

    def wait_verified(self, position: int) -> None:
        """Until verified() >= position. Raises as verified() does, or Stopped."""


@dataclass
class ExtractHooks:
    on_bytes: Callable[[int], None]  # data bytes written
    on_file: Callable[[str, int, str], None]  # (member name, size, final path) once renamed into place
    on_skip: Callable[[str, int], None]
    stop: threading.Event
    reserve_bytes: int = 0
    # (limit, seconds): the writer waited on the decoder (DECODE) or the decoder on the writer (DISK)
    on_wait: Callable[[Limit, float], None] = lambda limit, seconds: None
    writeback: Writeback = field(default_factory=Writeback)
    gate: CommitGate | None = None  # input read ahead of its verification: members land once it is verified
    # wakes a read of the source that waits for input (chain.PartChain.cancel): the extraction ended early
    # and joins its decoding thread
    cancel_source: Callable[[], None] = lambda: None


class _Commits:
    """Members written but not yet in place, in archive order, each with the input position it needs
    verified. Without a gate each one lands at once."""

    def __init__(self, gate: CommitGate | None, on_bytes: Callable[[int], None]) -> None:
        self.gate, self.on_bytes = gate, on_bytes
        # (position, land it, its temp file, data bytes written to it)
        self.pending: list[tuple[int, Callable[[], None], str | None, int]] = []
        self.added = 0

    def temp_name(self, target: str) -> str:
        """`.<name>.moet-partial` beside target, the name a rerun writes again (so a killed run leaves
        nothing behind); its own name only while the same name from earlier in the archive waits to land."""
        tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.moet-partial")
        if any(p[2] == tmp for p in self.pending):
            tmp = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{self.added}.moet-partial")
        return tmp

    def add(self, position: int, land: Callable[[], None], tmp: str | None = None, nbytes: int = 0) -> None:
        self.added += 1
        self.pending.append((position, land, tmp, nbytes))
        self.flush()

    def flush(self) -> None:
        """Land every member whose input is verified, in order (never waits)."""
        verified = self.gate.verified() if self.gate is not None and self.pending else None
        while self.pending and (verified is None or self.pending[0][0] <= verified):
            self.pending.pop(0)[1]()

    def finish(self, position: int) -> None:
        """At the end of the stream: wait until all input up to `position` is verified, then land the rest."""
        if self.gate is not None:
            self.gate.wait_verified(position)
        while self.pending:
            self.pending.pop(0)[1]()

    def discard(self) -> None:
        """The extraction ends early: what is verified lands, the rest's temp files go."""
        try:
            self.flush()
        except (DownloadError, Stopped):  # verification failed or stopped: nothing more lands (said by the verifier)
            pass
        except OSError as exc:  # a verified member could not land: the part is fetched again, say why once
            oplog.caught("download", exc, "landing the verified members of an extraction that ends early")
        for _, _, tmp, nbytes in self.pending:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
            self.on_bytes(-nbytes)  # extracted bytes count what is on disk
        self.pending.clear()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def extract_stream(source: IO[bytes] | io.RawIOBase, dest: Path, done: dict[str, int], hooks: ExtractHooks,
                   describe_pos: Callable[[], str] = lambda: "") -> None:
    """Extract a zstd-compressed tar stream into dest. Raises DownloadError subclasses or Stopped."""
    dest.mkdir(parents=True, exist_ok=True)
    dest_real = os.path.realpath(dest)
    reader = _Decompressor(source, hooks.stop, hooks.on_wait, hooks.gate, hooks.cancel_source)
    commits = _Commits(hooks.gate, hooks.on_bytes)
    try:
        with tarfile.open(fileobj=reader, mode="r|", bufsize=TAR_BUFSIZE) as tf:
            for member in tf:
                if hooks.stop.is_set():
                    raise Stopped()
                _extract_member(tf, member, dest_real, done, hooks, commits, reader)
            end_at = tf.offset
        if reader.delivered < end_at + tarfile.BLOCKSIZE:  # EOF where the next header or the end block belongs
            raise DownloadError(f"the archive is truncated {describe_pos()}: it ends without tar's end-of-archive "
                                "block, so files may be missing; the repo's parts do not form a complete archive")
        while reader.read(COPY_CHUNK):  # drain: frame checksums are checked and every part is consumed
            pass
        commits.finish(reader.tag)
    except zstandard.ZstdError as exc:
        commits.discard()
        raise DownloadError(f"decompression failed {describe_pos()}: {exc}") from None
    except tarfile.TarError as exc:
        commits.discard()
        if isinstance(exc, getattr(tarfile, "FilterError", ())):
            raise UnsafeArchiveError(f"archive refused by the data filter: {exc}") from None
        raise DownloadError(f"archive unreadable {describe_pos()}: {exc}") from None
    except BaseException:
        commits.discard()
        raise
    finally:
        reader.close()


class _Decompressor(io.RawIOBase):
    """zstd decompression (`stream_reader`) in its own thread, a bounded queue ahead of the tar writer.

    Decompression and file writes overlap (both release the GIL), like `zstd -d | tar -x`. Data
    goes into a small pool of reused buffers (no per-chunk allocation) and member data is written
    to files straight from them (`copy_to`); memory is bounded by QUEUE_CHUNKS × DECODE_CHUNK.
    Errors travel through the queue. `close` stops the decoding thread and joins it: the extraction
    never ends with it still reading the source (docs/downloads.md, "File descriptors").
    """

    def __init__(self, source: IO[bytes] | io.RawIOBase, stop: threading.Event,
                 on_wait: Callable[[Limit, float], None] = lambda limit, seconds: None,
                 gate: CommitGate | None = None, cancel_source: Callable[[], None] = lambda: None) -> None:
        self.on_wait = on_wait
        self.gate = gate
        self.cancel_source = cancel_source
        self.closing = threading.Event()  # the consumer has gone: the decoding thread ends
        # (buffer, bytes in it, input position once it was decoded: all it can depend on)
        self.q: queue.Queue[tuple[bytearray, int, int] | BaseException] = queue.Queue()
        self.free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(QUEUE_CHUNKS):
            self.free.put(bytearray(DECODE_CHUNK))
        self.stop = stop
        self.cur: bytearray | None = None
        self.buf = memoryview(b"")
        self.eof = False
        self.delivered = 0  # decompressed bytes handed out so far (the tar stream position)
        self.tag = 0  # the input position the bytes handed out so far depend on
        self.thread = threading.Thread(target=self._produce, args=(source,), name="zstd", daemon=True)
        self.thread.start()

    def _produce(self, source: IO[bytes] | io.RawIOBase) -> None:
        try:
            # any object with read() will do (the verified parts, mapped: chain.PartChain)
            zr = zstandard.ZstdDecompressor().stream_reader(cast(IO[bytes], source), read_size=READ_SIZE,
                                                            read_across_frames=True, closefd=False)
            with zr:
                while True:
                    buf = self._wait(self.free)
                    n = zr.readinto(buf)
                    self.q.put((buf, n, self.gate.position() if self.gate is not None else 0))
                    if not n:
                        return
        except BaseException as exc:  # handed to the consumer
            self.q.put(exc)

    def _wait(self, q: queue.Queue[T]) -> T:
        try:
            return q.get_nowait()
        except queue.Empty:
            pass
        started = time.monotonic()
        try:
            return self._wait_blocking(q)
        finally:  # the decoder waiting for a free buffer: the writer is behind; else the other way round
            self.on_wait(Limit.DISK if q is self.free else Limit.DECODE, time.monotonic() - started)

    def _wait_blocking(self, q: queue.Queue[T]) -> T:
        while True:
            try:
                return q.get(timeout=0.2)
            except queue.Empty:
                if self.stop.is_set() or self.closing.is_set():
                    raise Stopped() from None
                if q is self.q and not self.thread.is_alive() and self.q.empty():
                    raise DownloadError("decompressor stopped unexpectedly") from None

    def _next(self) -> bool:
        """Make self.buf non-empty; False at end of stream."""
        while not self.buf:
            if self.eof:
                return False
            if self.cur is not None:
                self.free.put(self.cur)
                self.cur = None
            item = self._wait(self.q)
            if isinstance(item, BaseException):
                self.eof = True
                raise item
            buf, n, tag = item
            if not n:
                self.eof = True
                self.tag = max(self.tag, tag)
                return False
            self.cur, self.buf, self.tag = buf, memoryview(buf)[:n], tag
        return True

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        """For tarfile's headers (small reads): a copy of exactly the next `size` bytes (fewer only at EOF).

        Exact, even across buffer boundaries (decompressed buffers end where a part ended, not on
        a tar block): a short read would leave bytes in tarfile's own buffer and push the member
        data off the copy_to fast path onto tarfile's 512-byte reads.
        """
        chunks, want = [], (1 << 62) if size < 0 else size
        while want > 0 and self._next():
            n = min(want, len(self.buf))
            chunks.append(bytes(self.buf[:n]))
            self.buf, want = self.buf[n:], want - n
        out = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.delivered += len(out)
        return out

    def readinto(self, b: WriteableBuffer) -> int:
        if not self._next():
            return 0
        view = memoryview(b)
        n = min(len(view), len(self.buf))
        view[:n] = self.buf[:n]
        self.buf = self.buf[n:]
        self.delivered += n
        return n

    def copy_to(self, fd: int, length: int, name: str, hooks: "ExtractHooks") -> None:
        """Write the next `length` bytes to fd straight from the decompressed buffers."""
        left = length
        while left > 0:
            if not self._next():
                raise tarfile.ReadError(f"unexpected end of data in {name}")
            view = self.buf[:left]
            self.buf = self.buf[len(view):]
            left -= len(view)
            self.delivered += len(view)
            hooks.on_bytes(len(view))
            _write_all(fd, view)
            hooks.writeback.wrote(fd, len(view))
            if hooks.stop.is_set():
                raise Stopped()

    def close(self) -> None:
        self.eof = True
        self.closing.set()
        if self.thread is not threading.current_thread():
            self.cancel_source()
            self.thread.join(JOIN_S)
            if self.thread.is_alive():
                oplog.decision("downloads", "thread-stuck", who=oplog.PANEL, level=logging.ERROR, thread=self.thread.name,
                               waited_s=JOIN_S, reason="the decoder did not stop after the extraction ended")
        super().close()


def _extract_member(tf: tarfile.TarFile, m: tarfile.TarInfo, dest_real: str, done: dict[str, int], hooks: ExtractHooks,
                    commits: _Commits, reader: _Decompressor) -> None:
    target = check_member(m, dest_real)
    fm = apply_data_filter(m, dest_real)
    if m.isdir():
        os.makedirs(target, exist_ok=True)
        return
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if m.issym() or m.islnk():
        def link() -> None:
            _replace_with_link(fm, target, dest_real)  # the filtered member: its linkname is the checked one
            hooks.on_file(m.name, 0, target)
        commits.add(reader.tag, link)
        return
    if done.get(m.name) == m.size and not os.path.islink(target) and os.path.isfile(target) \
            and os.path.getsize(target) == m.size:
        hooks.on_skip(m.name, m.size)
        return
    tmp, written = _write_regular(tf, m, fm.mode, target, hooks, commits.temp_name(target))

    def land() -> None:
        os.replace(tmp, target)
        hooks.on_file(m.name, m.size, target)
    commits.add(reader.tag, land, tmp, written)


def _replace_with_link(m: tarfile.TarInfo, target: str, dest_real: str) -> None:
    if os.path.lexists(target):
        if os.path.isdir(target) and not os.path.islink(target):
            raise UnsafeArchiveError(f"refused archive member {m.name!r}: a link would replace a directory")
        os.unlink(target)
    if m.issym():
        os.symlink(m.linkname, target)
    else:
        os.link(os.path.join(dest_real, m.linkname), target)


def _write_regular(tf: tarfile.TarFile, m: tarfile.TarInfo, mode: int, target: str, hooks: ExtractHooks,
                   tmp: str) -> tuple[str, int]:
    """Write the member's data to the temp file `tmp` beside target (the caller lands it); return it and
    the data bytes written."""
    sparse: Any = m.sparse  # tarfile keeps [(offset, length), ...] here (typeshed says bytes)
    extents: list[tuple[int, int]] = list(sparse) if sparse else [(0, m.size)]
    need = sum(length for _, length in extents)
    parent = os.path.dirname(target)
    free = free_bytes(Path(parent))
    if free < need + hooks.reserve_bytes:
        raise SpaceError(f"not enough disk space for {m.name}: it needs {_fmt(need)}, {_fmt(free)} free on "
                         f"{parent}; free some space, then Resume")
    src: Any = tf.fileobj  # tarfile's private _Stream: .fileobj is our reader, .pos its position
    src.seek(m.offset_data)
    # Fast path: tarfile's stream holds no read-ahead, so member data comes straight from the
    # decompressor's buffers; tarfile's position is advanced by hand (it seeks forward after).
    reader = src.fileobj
    direct: _Decompressor | None = reader if isinstance(reader, _Decompressor) and not getattr(src, "buf", b"") \
        and getattr(src, "pos", None) == m.offset_data else None
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    written = [0]  # data bytes on_bytes counted for this file: taken back if the file goes

    def count(n: int) -> None:
        written[0] += n
        hooks.on_bytes(n)
    mine = dataclasses.replace(hooks, on_bytes=count)
    try:
        for offset, length in extents:
            os.lseek(fd, offset, os.SEEK_SET)  # seeking over holes keeps them holes
            if direct is not None:
                direct.copy_to(fd, length, m.name, mine)
                src.pos += length
            else:
                _copy(src, fd, length, m.name, mine)
        if direct is not None and need % tarfile.BLOCKSIZE:  # skip the padding too: tarfile's own skip would read a whole
            pad = tarfile.BLOCKSIZE - need % tarfile.BLOCKSIZE  # block and keep the rest, off the fast path
            if len(direct.read(pad)) != pad:
                raise tarfile.ReadError(f"unexpected end of data in {m.name}")
            src.pos += pad
        os.ftruncate(fd, m.size)
        os.fchmod(fd, mode & 0o7777)
    except OSError as exc:
        hooks.writeback.closed(fd)
        os.close(fd)
        os.unlink(tmp)
        hooks.on_bytes(-written[0])
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise SpaceError(f"disk full while writing {m.name} under {parent}; free some space, then Resume") from None
        raise
    except BaseException:
        hooks.writeback.closed(fd)
        os.close(fd)
        os.unlink(tmp)
        hooks.on_bytes(-written[0])
        raise
    hooks.writeback.closed(fd)
    os.close(fd)
    os.utime(tmp, (m.mtime, m.mtime))
    return tmp, written[0]


def _copy(src: io.RawIOBase, fd: int, length: int, name: str, hooks: ExtractHooks) -> None:
    left = length
    while left > 0:
        buf = src.read(min(COPY_CHUNK, left))
        if not buf:
            raise tarfile.ReadError(f"unexpected end of data in {name}")
        _write_all(fd, memoryview(buf))
        hooks.writeback.wrote(fd, len(buf))
        left -= len(buf)
        hooks.on_bytes(len(buf))
        if hooks.stop.is_set():
            raise Stopped()


def _write_all(fd: int, view: memoryview) -> None:
    # Slices of WRITE_SLICE: the kernel's copy into the page cache stays within L2
    # (docs/downloads.md, "Measurements behind the code").
    while view:
        view = view[os.write(fd, view[:WRITE_SLICE]):]


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"
