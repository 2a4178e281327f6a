"""Alerts to a person through Apprise (docs/engine.md, "Telling a person"): one list of Apprise URLs
(e-mail, ntfy, Slack, Discord, Telegram, plain webhooks: `json://`, `form://`), set in the Service tab or by
MOET_PANEL_NOTIFY. Sending happens on the notifier's own thread, so the reconciler (and the UI) never wait
for a mail server; secrets in the URLs are never shown (`mask_url`, Apprise's own privacy rendering).
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

from app.backend import oplog

from app.backend.oplog import redact


def _unusable(url: str) -> str:
    """Why Apprise cannot use `url`, '' when it can."""
    import apprise

    try:
        obj = apprise.Apprise.instantiate(url)
    except Exception as exc:  # a plugin's own parser can raise on odd input: the URL is unusable (handed on)
        return f"Apprise cannot read this URL ({type(exc).__name__})"
    return "" if obj is not None else "Apprise does not understand this URL"


def mask_url(url: str) -> str:
    """The URL as it may be shown (`app.backend.oplog.redact.mask_url`: user, password, a token host, path and query
    starred), or its scheme with a note when Apprise cannot use it."""
    if _unusable(url):
        return (url.split("://", 1)[0] + "://… (not a valid Apprise URL)") if "://" in url else "(not a URL)"
    return redact.mask_url(url)


def check_urls(urls: list[str] | tuple[str, ...]) -> list[str]:
    """One problem line per URL Apprise cannot use (masked), [] when all are fine."""
    return [f"{mask_url(u)}: {why} (see the Apprise wiki for the format)" for u in urls if (why := _unusable(u))]


@dataclass(frozen=True)
class Sent:
    ts: float
    title: str
    ok: bool
    targets: tuple[str, ...]  # masked


class Notifier:
    """A queue and one sender thread. `send()` never blocks; `send_test()` waits for its own result."""

    def __init__(self, urls_fn: Callable[[], tuple[str, ...]]) -> None:
        self._urls_fn = urls_fn
        self._q: queue.Queue[tuple[str, str, str, threading.Event | None, list[bool]]] = queue.Queue(maxsize=200)
        self.history: collections.deque[Sent] = collections.deque(maxlen=50)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="notify-sender", daemon=True)
        self._thread.start()

    def send(self, title: str, body: str, kind: str = "info") -> bool:
        """Queue a message of Apprise notify type `kind` (info, success, warning, failure); False when there is
        no URL to send to (or the queue is full)."""
        if not self._urls_fn():
            return False
        try:
            self._q.put_nowait((title, body, kind, None, []))
            return True
        except queue.Full:
            oplog.decision("service", "alert_dropped", who=oplog.PANEL, title=title, reason="the send queue is full")
            return False

    def send_test(self, timeout_s: float = 30.0) -> str:
        """Send a test message now (the Service tab's button); the answer says where and whether it went."""
        urls = self._urls_fn()
        if not urls:
            return "no notification URL is set: add one (or set MOET_PANEL_NOTIFY)"
        if bad := check_urls(urls):
            return "not sent: " + "; ".join(bad)
        done, result = threading.Event(), list[bool]()
        self._q.put(("moet-panel: test notification", "If you read this, alerts from the panel reach you.", "info",
                     done, result))
        if not done.wait(timeout_s):
            return f"still sending after {timeout_s:.0f} s to {', '.join(mask_url(u) for u in urls)}"
        where = ", ".join(mask_url(u) for u in urls)
        return f"sent to {where}" if result and result[0] else f"sending to {where} failed (see the panel log)"

    def _run(self) -> None:
        while not self._closed:
            try:
                title, body, kind, done, result = self._q.get(timeout=0.5)
            except queue.Empty:
                continue
            urls = self._urls_fn()
            ok = self._deliver(urls, title, body, kind)
            self.history.append(Sent(time.time(), title, ok, tuple(mask_url(u) for u in urls)))
            result.append(ok)
            if done is not None:
                done.set()

    @staticmethod
    def _deliver(urls: tuple[str, ...], title: str, body: str, kind: str = "info") -> bool:
        if not urls:
            return False
        try:
            import apprise

            ap = apprise.Apprise()
            for u in urls:
                redact.register_url(u)  # whatever Apprise logs or raises about it is starred
                ap.add(u)
            # Apprise sends nothing without a body; the type picks the colour/icon/priority on the receiver
            ok = bool(ap.notify(body=body or title, title=title, notify_type=apprise.NotifyType(kind)))
        except Exception as exc:  # a plugin's failure must not end the sender thread
            oplog.caught("service", exc, "sending a notification", title=title)
            return False
        if not ok:
            oplog.decision("service", "notify_failed", who=oplog.PANEL, title=title,
                           targets=" ".join(redact.mask_url(u) for u in urls), reason="Apprise reported a failure")
        return ok

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=2.0)
