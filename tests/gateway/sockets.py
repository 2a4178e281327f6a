"""The listening TCP sockets of a network namespace, read from /proc/<pid>/net/tcp{,6} (what `ss -ltn` reads).

The panel runs engines with `--network host`, so the engine container's namespace is the box's: a socket
it opened on 0.0.0.0 is reachable from the network. Reading the container's own pid's view works wherever
the test runs."""

from __future__ import annotations

import ipaddress
import socket
import struct
from pathlib import Path

LISTEN = "0A"


def _addr(hexaddr: str, v6: bool) -> str:
    raw = bytes.fromhex(hexaddr)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, struct.pack("<I", struct.unpack(">I", raw)[0]))
    words = struct.unpack(">4I", raw)
    return socket.inet_ntop(socket.AF_INET6, b"".join(struct.pack("<I", w) for w in words))


def listening(pid: int | str = "self") -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket in `pid`'s network namespace."""
    out: list[tuple[str, int]] = []
    for name, v6 in (("tcp", False), ("tcp6", True)):
        path = Path(f"/proc/{pid}/net/{name}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) > 3 and parts[3] == LISTEN:
                host, port = parts[1].split(":")
                out.append((_addr(host, v6), int(port, 16)))
    return out


def non_loopback(sockets: list[tuple[str, int]]) -> list[tuple[str, int]]:
    return [(a, p) for a, p in sockets if not ipaddress.ip_address(a).is_loopback]


# Run inside the engine's container (both test images carry /usr/bin/python3.11): the listening sockets
# that belong to the container's own processes (socket inodes from /proc/<pid>/fd matched against
# /proc/net/tcp{,6}), printed as JSON. Exact: the host's other listeners are not counted.
_IN_CONTAINER = r"""
import json, os, socket, struct
inodes = set()
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            for fd in os.listdir(f'/proc/{pid}/fd'):
                t = os.readlink(f'/proc/{pid}/fd/{fd}')
                if t.startswith('socket:['):
                    inodes.add(t[8:-1])
        except OSError:
            pass
out = []
for name, fam in (('tcp', socket.AF_INET), ('tcp6', socket.AF_INET6)):
    try:
        lines = open(f'/proc/net/{name}').read().splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        p = line.split()
        if p[3] != '0A' or p[9] not in inodes:
            continue
        h, port = p[1].split(':')
        raw = bytes.fromhex(h)
        n = len(raw) // 4
        raw = b''.join(struct.pack('<I', w) for w in struct.unpack(f'>{n}I', raw))
        out.append([socket.inet_ntop(fam, raw), int(port, 16)])
print(json.dumps(out))
"""


def container_listening(container: object) -> list[tuple[str, int]]:
    """The listening sockets of a running container's own processes (docker exec, the image's Python)."""
    import json

    res = container.exec_run(["/usr/bin/python3.11", "-c", _IN_CONTAINER])  # type: ignore[attr-defined]
    assert res.exit_code == 0, res.output.decode(errors="replace")
    return [(a, int(p)) for a, p in json.loads(res.output.decode().strip().splitlines()[-1])]
