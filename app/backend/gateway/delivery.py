"""An answer's way to its client, apart from the engine's (docs/gateway.md "The slot is the GPU's").

The engine's answer is read at the engine's speed into an `Answer` held in memory (bounded: about what the
request's `max_tokens` cap can produce), and the client is written from it at the client's speed. So the
engine's sequence, and the fair queue's slot, are freed when the engine finishes, not when the last byte
reaches a slow reader: a slow reader holds memory, never the GPU.

`ClientProgress` says whether the client is still taking its answer, from the bytes its TCP stack has
acknowledged (Linux `TCP_INFO.tcpi_bytes_acked`) and what still waits to go (the transport's buffer and the
socket's send queue, `SIOCOUTQ`). A blocked send was the old measure: the kernel's buffers (2.81 MB measured,
issue 48) hid a reader taking 1 byte a second or 64 KiB every 25 s from it. Where these reads are not
available (another OS), a send blocked for the stall time is the measure, as before.
"""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios
from collections import deque
from typing import Any

_TCP_INFO_LEN = 232  # struct tcp_info up to tcpi_bytes_acked and beyond (Linux >= 4.1)
_BYTES_ACKED_AT = 120  # offsetof(struct tcp_info, tcpi_bytes_acked): __u64
BYTES_PER_TOKEN = 2048  # an SSE event of one token is ~200-400 bytes; room for logprobs before the bound bites
MIN_ANSWER_BYTES = 1 << 20


def answer_bound(max_tokens: int) -> int:
    """The bytes one answer may hold in memory: what `max_tokens` tokens make, with room (docs/gateway.md)."""
    return max(MIN_ANSWER_BYTES, max_tokens * BYTES_PER_TOKEN)


class Answer:
    """Bytes read from the engine, waiting for the client. The engine's reader `put`s and `finish`es; the client's
    writer `take`s. Past `limit` bytes the reader waits for room (the engine's socket is then read no faster than
    the client reads: the old behaviour, reached only by an answer far bigger than its cap makes)."""

    def __init__(self, limit: int):
        self.limit = max(1, limit)
        self._parts: deque[bytes] = deque()
        self.size = 0
        self.finished = False
        self._more = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    def put(self, data: bytes) -> None:
        if data:
            self._parts.append(data)
            self.size += len(data)
            self._more.set()
            if self.size > self.limit:
                self._room.clear()

    def finish(self) -> None:
        self.finished = True
        self._more.set()

    async def room(self) -> None:
        await self._room.wait()

    async def take(self) -> bytes | None:
        """Everything waiting, joined; None once the engine finished and all was taken."""
        while not self._parts:
            if self.finished:
                return None
            self._more.clear()
            await self._more.wait()
        data = b"".join(self._parts) if len(self._parts) > 1 else self._parts[0]
        self._parts.clear()
        self.size = 0
        self._room.set()
        return data


def _socket_of(transport: Any) -> Any:
    get = getattr(transport, "get_extra_info", None)
    return get("socket") if get is not None else None


class ClientProgress:
    """How far a client has taken its answer, read from its TCP connection."""

    def __init__(self, transport: Any, now: float):
        self.transport = transport
        self._sock: Any = _socket_of(transport) if transport is not None else None
        self.acked = -1
        self.progress_at = now
        self.measured = self._sock is not None and self._read_acked() is not None

    def _read_acked(self) -> int | None:
        try:
            info = self._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
            if len(info) < _BYTES_ACKED_AT + 8:
                return None
            return int(struct.unpack_from("<Q", info, _BYTES_ACKED_AT)[0])
        except (OSError, AttributeError, ValueError):
            return None

    def _unsent(self) -> int:
        """Bytes given to the connection that its client has not acknowledged yet."""
        buffered = 0
        try:
            buffered = int(self.transport.get_write_buffer_size())
        except (AttributeError, RuntimeError):
            pass
        try:
            out = bytearray(4)
            fcntl.ioctl(self._sock.fileno(), termios.TIOCOUTQ, out)  # SIOCOUTQ: unsent + unacknowledged
            return buffered + int(struct.unpack("i", out)[0])
        except (OSError, AttributeError, ValueError):
            return buffered

    def reset(self) -> None:
        """Cut the connection now, dropping what the kernel still holds for it (a close would leave it trying to
        deliver the rest to a client that takes nothing: an orphaned socket holding its buffers)."""
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
        except (OSError, AttributeError):
            pass
        abort = getattr(self.transport, "abort", None)
        if abort is not None:
            abort()

    def waiting(self) -> bool:
        """Bytes still on their way to the client (ours or the kernel's)."""
        return self._unsent() > 0

    def check(self, now: float) -> float:
        """Seconds since the client last acknowledged a byte (0 when it just did, or nothing waits)."""
        acked = self._read_acked()
        if acked is None:
            return 0.0
        if acked != self.acked:
            self.acked = acked
            self.progress_at = now
            return 0.0
        if not self.waiting():
            self.progress_at = now  # nothing to take: not a stall
            return 0.0
        return now - self.progress_at
