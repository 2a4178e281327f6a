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


def mask_url(url: str) -> str:
    """The URL as it may be shown: passwords and tokens starred by Apprise, query dropped; unparsable -> scheme."""
    try:
        import apprise

        obj = apprise.Apprise.instantiate(url)
    except Exception:  # a plugin's own parser can raise on odd input
        obj = None
    if obj is None:
        return (url.split("://", 1)[0] + "://… (not a valid Apprise URL)") if "://" in url else "(not a URL)"
    return str(obj.url(privacy=True)).split("?", 1)[0]  # type: ignore[no-untyped-call]


def check_urls(urls: list[str] | tuple[str, ...]) -> list[str]:
    """One problem line per URL Apprise cannot use (masked), [] when all are fine."""
    import apprise

    bad = []
    for u in urls:
        try:
            ok = apprise.Apprise.instantiate(u) is not None
        except Exception:
            ok = False
        if not ok:
            bad.append(f"{mask_url(u)}: Apprise does not understand this URL (see the Apprise wiki for the format)")
    return bad


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
        self._q: queue.Queue[tuple[str, str, threading.Event | None, list[bool]]] = queue.Queue(maxsize=200)
        self.history: collections.deque[Sent] = collections.deque(maxlen=50)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="notify-sender", daemon=True)
        self._thread.start()

    def send(self, title: str, body: str) -> bool:
        """Queue a message; False when there is no URL to send to (or the queue is full)."""
        if not self._urls_fn():
            return False
        try:
            self._q.put_nowait((title, body, None, []))
            return True
        except queue.Full:
            return False

    def send_test(self, timeout_s: float = 30.0) -> str:
        """Send a test message now (the Service tab's button); the answer says where and whether it went."""
        urls = self._urls_fn()
        if not urls:
            return "no notification URL is set: add one (or set MOET_PANEL_NOTIFY)"
        if bad := check_urls(urls):
            return "not sent: " + "; ".join(bad)
        done, result = threading.Event(), list[bool]()
        self._q.put(("moet-panel: test notification", "If you read this, alerts from the panel reach you.", done,
                     result))
        if not done.wait(timeout_s):
            return f"still sending after {timeout_s:.0f} s to {', '.join(mask_url(u) for u in urls)}"
        where = ", ".join(mask_url(u) for u in urls)
        return f"sent to {where}" if result and result[0] else f"sending to {where} failed (see the panel log)"

    def _run(self) -> None:
        while not self._closed:
            try:
                title, body, done, result = self._q.get(timeout=0.5)
            except queue.Empty:
                continue
            urls = self._urls_fn()
            ok = self._deliver(urls, title, body)
            self.history.append(Sent(time.time(), title, ok, tuple(mask_url(u) for u in urls)))
            result.append(ok)
            if done is not None:
                done.set()

    @staticmethod
    def _deliver(urls: tuple[str, ...], title: str, body: str) -> bool:
        if not urls:
            return False
        try:
            import apprise

            ap = apprise.Apprise()
            for u in urls:
                ap.add(u)
            return bool(ap.notify(body=body or title, title=title))  # Apprise sends nothing without a body
        except Exception:  # a plugin's failure must not end the sender thread
            return False

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=2.0)
