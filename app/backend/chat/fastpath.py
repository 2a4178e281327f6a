"""Send tickets: a reply started by the page's fast route, handed to the page's Gradio event.

The Chat tab's Send starts the reply twice over, and the engine must see one request. A small
script on the page posts the Send (with a random ticket) straight to the panel's fast route, which
starts the turn at once and streams its first tokens back; the Gradio event fired by the same click
then *claims* the turn by its ticket instead of sending again, and renders it as usual (history,
Stop, stats). A claim checks that both carried the same conversation, text and settings. A turn
that nobody claims (the page went away between the two) is stopped after `unclaimed_s`.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.backend.chat.client import SamplingParams
from app.backend.chat.turn import Turn

TICKET_RE = re.compile(r"^[A-Za-z0-9-]{16,64}$")
CLAIM_WAIT_S = 5.0  # the Gradio event may overtake the fast request; how long it waits for it
UNCLAIMED_S = 60.0  # an unclaimed reply is stopped after this (generous: Gradio's queue may be busy)
KEEP_S = 120.0  # how long a settled ticket is remembered (a late duplicate is refused, not resent)


class TicketError(ValueError):
    """The page's Send cannot be used as it is (bad field, or it disagrees with the Gradio event)."""


@dataclass(frozen=True)
class PageSend:
    """One Send from the chat page: the same fields the Gradio event carries."""

    ticket: str
    conv_id: str
    text: str
    edit: bool
    system_prompt: str
    custom_url: str
    sampling: SamplingParams

    @classmethod
    def from_json(cls, body: Any) -> "PageSend":
        """Validate the fast route's JSON body; TicketError names the bad field."""
        if not isinstance(body, dict):
            raise TicketError("body must be a JSON object")

        def text_field(name: str, limit: int) -> str:
            value = body.get(name, "")
            if value is None:
                value = ""
            if not isinstance(value, str) or len(value) > limit:
                raise TicketError(f"{name} must be a string of at most {limit} characters")
            return value

        def number(name: str, optional: bool = False) -> float | None:
            value = body.get(name)
            if value is None and optional:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TicketError(f"{name} must be a number")
            return float(value)

        ticket = text_field("ticket", 64)
        if not TICKET_RE.fullmatch(ticket):
            raise TicketError("ticket must be 16-64 letters, digits or '-'")
        if not isinstance(body.get("edit", False), bool):
            raise TicketError("edit must be true or false")
        max_tokens = number("max_tokens", optional=True)
        return cls(
            ticket=ticket,
            conv_id=text_field("conv_id", 64),
            text=text_field("text", 1_000_000),
            edit=bool(body.get("edit", False)),
            system_prompt=text_field("system_prompt", 1_000_000),
            custom_url=text_field("custom_url", 2000).strip(),
            sampling=SamplingParams(number("temperature"), number("top_p"), number("min_p"),  # type: ignore[arg-type]
                                    int(max_tokens) if max_tokens else None),
        )

    def mismatch(self, other: "PageSend") -> list[str]:
        """Names of the fields on which two descriptions of one Send disagree (ticket aside)."""
        mine, theirs = self._key(), other._key()
        return [name for name in mine if mine[name] != theirs[name]]

    def _key(self) -> dict[str, Any]:
        return {"conversation": self.conv_id, "text": self.text.strip(), "edit": self.edit,
                "system prompt": self.system_prompt, "endpoint": self.custom_url.strip(),
                "sampling": self.sampling}


@dataclass
class _Entry:
    send: PageSend | None = None
    turn: Turn | None = None
    first_message: bool = False
    error: str = ""  # the fast route could not start the reply (the Gradio event then sends itself)
    claimed: bool = False
    abandoned: bool = False  # the Gradio event gave up waiting: a late fast request is refused
    settled_at: float | None = None
    wakers: list[Callable[[], None]] = field(default_factory=list)


@dataclass(frozen=True)
class Claim:
    turn: Turn
    first_message: bool


class TicketBook:
    """Thread-safe registry of fast-started turns by ticket."""

    def __init__(self, unclaimed_s: float = UNCLAIMED_S, keep_s: float = KEEP_S,
                 clock: Callable[[], float] = time.monotonic):
        self._unclaimed_s = unclaimed_s
        self._keep_s = keep_s
        self._clock = clock
        self._cond = threading.Condition()
        self._entries: dict[str, _Entry] = {}

    # ---- the fast route ------------------------------------------------------------------------
    def start(self, send: PageSend, starter: Callable[[PageSend], tuple[Turn, bool]]) -> Turn:
        """Start the reply for `send` with `starter` (which raises on refusal) and file it under its
        ticket. A ticket is used once; one the Gradio event has given up on is refused."""
        with self._cond:
            self._expire()
            entry = self._entries.get(send.ticket)
            if entry is None:
                entry = self._entries[send.ticket] = _Entry(send=send)
            elif entry.send is None and not entry.abandoned:
                entry.send = send  # the Gradio event got here first and is waiting for this
            else:
                raise TicketError("this ticket was already used or given up on")
        try:
            turn, first = starter(send)
        except Exception as exc:
            with self._cond:
                entry.error = str(exc) or type(exc).__name__
                entry.settled_at = self._clock()
                self._cond.notify_all()
            raise
        with self._cond:
            entry.turn, entry.first_message = turn, first
            self._cond.notify_all()
        timer = threading.Timer(self._unclaimed_s, self._stop_unclaimed, args=(send.ticket,))
        timer.daemon = True
        timer.start()
        return turn

    def subscribe_claim(self, ticket: str, wake: Callable[[], None]) -> None:
        """Call `wake()` once the ticket is claimed (the fast route then says so to the page)."""
        with self._cond:
            entry = self._entries.get(ticket)
            if entry is None:
                return
            if entry.claimed:
                wake()
            else:
                entry.wakers.append(wake)

    def release(self, ticket: str, grace_s: float = CLAIM_WAIT_S) -> None:
        """The page stopped following this Send (it left, or the page closed) before the Gradio
        event claimed it: stop the reply unless it is claimed within `grace_s`."""
        with self._cond:
            entry = self._entries.get(ticket)
            if entry is None or entry.claimed or entry.turn is None:
                return
        timer = threading.Timer(grace_s, self._stop_unclaimed, args=(ticket,))
        timer.daemon = True
        timer.start()

    def is_claimed(self, ticket: str) -> bool:
        with self._cond:
            entry = self._entries.get(ticket)
            return entry is not None and entry.claimed

    # ---- the Gradio event ----------------------------------------------------------------------
    def claim(self, expected: PageSend, timeout: float = CLAIM_WAIT_S) -> Claim | None:
        """The turn the fast route started for this ticket, once it has. None when the fast route
        refused it or never came (the caller then sends itself). TicketError when the fast route
        started it with other fields than the Gradio event carries: that turn is stopped."""
        deadline = self._clock() + timeout
        with self._cond:
            self._expire()
            entry = self._entries.get(expected.ticket)
            if entry is None:  # not here yet: the Gradio event overtook the fast request
                entry = self._entries[expected.ticket] = _Entry()
            while entry.turn is None and not entry.error:
                left = deadline - self._clock()
                if left <= 0:
                    break
                self._cond.wait(left)
            if entry.turn is None:
                entry.abandoned = True
                entry.settled_at = self._clock()
                return None
            if entry.claimed:
                raise TicketError("this Send was already taken by another event")
            entry.claimed, entry.settled_at = True, self._clock()
            wakers, entry.wakers = entry.wakers, []
            send, turn, first = entry.send, entry.turn, entry.first_message
        for wake in wakers:
            wake()
        assert send is not None
        wrong = send.mismatch(expected)
        if wrong:
            turn.stop(timeout=0)
            raise TicketError("the page's quick start and its Send disagreed on " + ", ".join(wrong)
                              + "; that reply was stopped. Reload the page and send again.")
        return Claim(turn, first)

    # ---- housekeeping --------------------------------------------------------------------------
    def _stop_unclaimed(self, ticket: str) -> None:
        with self._cond:
            entry = self._entries.get(ticket)
            if entry is None or entry.claimed or entry.turn is None:
                return
            entry.abandoned, entry.settled_at = True, self._clock()
            turn = entry.turn
        turn.stop(timeout=0)

    def _expire(self) -> None:
        """Forget settled tickets after `keep_s` (called with the lock held)."""
        now = self._clock()
        old = [t for t, e in self._entries.items() if e.settled_at is not None and now - e.settled_at > self._keep_s]
        for t in old:
            del self._entries[t]

    def __len__(self) -> int:
        with self._cond:
            return len(self._entries)
