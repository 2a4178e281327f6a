"""Connections per source: one stranger cannot fill the gateway (issue 40, docs/gateway.md "Threats").

uvicorn caps connections for everyone together (`Limits.max_connections`); without a cap per source, one
client opening 2,200 idle connections got every keyed request a 503. Here each source — an IPv4 address, or
an IPv6 /64 (what one host is usually given) — holds at most `per_source` connections. When a source is at its
cap, its oldest connection that has not yet shown a valid key and is waiting for a request is closed to make
room (so a flood from an address evicts only its own idle connections, and a keyed client behind the same
address still gets in); when there is none, the new connection is refused. The same rule holds for all
sources together just below the global cap (`total`): there the oldest such connection of any source makes
room, so strangers from many addresses cannot fill the global cap either.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any, Protocol


class Guarded(Protocol):
    authed: bool
    transport: Any  # the connection's asyncio transport (the gateway reads its client's progress from it)

    def evictable(self) -> bool: ...

    def evict(self) -> None: ...


def source_of(host: str) -> str:
    """The source a connection counts against: the IPv4 address, or the IPv6 /64."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host  # a unix socket or an odd peer: its own source
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{ip}/64", strict=False))
    return str(ip)


class ConnGuard:
    """Shared by the protocol instances of one server (all on its event loop: no lock)."""

    def __init__(self, per_source: int, on_refusal: Callable[[str], None] | None = None, total: int = 0):
        self.per_source = max(1, per_source)
        self.total = total  # 0: no global rule here
        self._all: dict[int, Guarded] = {}  # every connection, oldest first
        self._by_source: dict[str, dict[int, Guarded]] = {}  # insertion order: oldest first
        self._by_peer: dict[tuple[str, int], Guarded] = {}
        self.on_refusal = on_refusal
        self.evicted = 0
        self.refused = 0

    def count(self, host: str) -> int:
        return len(self._by_source.get(source_of(host), {}))

    def opened(self, conn: Guarded, peer: tuple[str, int] | None) -> bool:
        """Register a new connection; False: refuse it (its source is full of keyed, busy connections)."""
        if peer is None:
            return True
        conns = self._by_source.setdefault(source_of(peer[0]), {})
        if len(conns) >= self.per_source:
            victim = next((c for c in conns.values() if c.evictable()), None)
            if victim is None:
                self.refused += 1
                self.refusal("too_many_connections")
                return False
            conns.pop(id(victim), None)
            self._all.pop(id(victim), None)
            self.evicted += 1
            victim.evict()
            self.refusal("evicted_idle")
        elif self.total and len(self._all) >= self.total:
            victim = next((c for c in self._all.values() if c.evictable()), None)
            if victim is not None:  # none: uvicorn's own cap answers 503
                self._all.pop(id(victim), None)
                for other in self._by_source.values():
                    other.pop(id(victim), None)
                self.evicted += 1
                victim.evict()
                self.refusal("evicted_idle")
        conns[id(conn)] = conn
        self._all[id(conn)] = conn
        self._by_peer[(peer[0], peer[1])] = conn
        return True

    def closed(self, conn: Guarded, peer: tuple[str, int] | None) -> None:
        if peer is None:
            return
        self._all.pop(id(conn), None)
        src = source_of(peer[0])
        conns = self._by_source.get(src)
        if conns is not None:
            conns.pop(id(conn), None)
            if not conns:
                del self._by_source[src]
        if self._by_peer.get((peer[0], peer[1])) is conn:
            del self._by_peer[(peer[0], peer[1])]

    def connection(self, peer: tuple[str, int] | None) -> Guarded | None:
        """The connection from `peer` (its transport: delivery.ClientProgress reads what its client took)."""
        return self._by_peer.get((peer[0], peer[1])) if peer is not None else None

    def authenticated(self, peer: tuple[str, int] | None) -> None:
        """The app saw a valid key on this connection: it keeps its slot and the longer deadlines."""
        if peer is None:
            return
        conn = self._by_peer.get((peer[0], peer[1]))
        if conn is not None:
            conn.authed = True

    def refusal(self, reason: str) -> None:
        if self.on_refusal is not None:
            self.on_refusal(reason)
