"""What the Service tab shows and changes (app/ui/service.py stays thin): the restart policy, the supervisor's
counters and canary, the notification targets (masked), the test message."""

from __future__ import annotations

from dataclasses import dataclass

from app.backend import oplog

from app.backend.config import env
from app.backend.oplog.redact import redact, register_url
from app.backend.engine.supervision.restartpolicy import NON_HEALING, parse_policy
from app.backend.service.config import ServiceConfig, ServiceConfigStore, effective_notify_urls, effective_policy
from app.backend.alerts.notify import check_urls, mask_url
from app.backend.state import AppState


@dataclass(frozen=True)
class ServiceView:
    policy: str
    policy_source: str
    desired: str
    state: str
    restarts_total: int
    restart_try: int
    gave_up: bool
    canary: str
    stalls_total: int
    switches_ok: int
    switches_failed: int
    message: str
    targets: tuple[str, ...]  # masked
    targets_source: str
    sent: tuple[str, ...]  # the last messages told, newest last


def _store(state: AppState) -> ServiceConfigStore:
    return ServiceConfigStore(state.settings.state_dir)


def view(state: AppState) -> ServiceView:
    store = _store(state)
    policy, psrc = effective_policy(store, state.settings.recipe.engine.restart)
    urls, usrc = effective_notify_urls(store)
    snap = state.engine.snapshot() if state.engine is not None else None
    sent = tuple(redact(m.title) for m in (state.alerting.sent[-5:] if state.alerting is not None else []))
    return ServiceView(
        policy, psrc, (snap.desired or "not set yet") if snap else "-", snap.state.value if snap else "-",
        snap.restarts_total if snap else 0, snap.restart_try if snap else 0, bool(snap and snap.gave_up),
        (snap.canary or "off / not ready") if snap else "-", snap.stalls_total if snap else 0,
        snap.switches_ok if snap else 0, snap.switches_failed if snap else 0, redact(snap.message) if snap else "",
        tuple(mask_url(u) for u in urls), usrc, sent)


def set_policy(state: AppState, value: str, who: str = oplog.PAGE) -> str:
    """`who`: who asked (oplog.user(name) from the page), for the operator's log."""
    try:
        policy = parse_policy(value)
    except ValueError as exc:
        return str(exc)
    store = _store(state)
    cfg = store.read()
    try:
        store.write(ServiceConfig(policy, cfg.notify_urls, cfg.drain_grace_s))
    except OSError as exc:
        oplog.caught("service", exc, "saving the restart policy", who=who)
        return f"not saved: cannot write {store.path} ({exc.strerror or exc})"
    oplog.decision("service", "setting_changed", who=who, setting="restart_policy", old=cfg.restart_policy or "recipe",
                   new=policy)
    note = (f" — but {env.ENGINE_RESTART}={env.engine_restart()} is set and wins until it is unset"
            if env.engine_restart() else "")
    return f"restart policy saved: {policy}{note}"


def set_notify_urls(state: AppState, text: str, who: str = oplog.PAGE) -> str:
    """Replace the list with the URLs in `text` (one per line or space-separated); '' keeps the list."""
    urls = tuple(text.split())
    if not urls:
        return "nothing entered: the list is unchanged (use Clear to remove every URL)"
    for u in urls:
        register_url(u)  # before anything can log or show it
    if bad := check_urls(urls):
        return "not saved: " + "; ".join(bad)
    return _save_urls(state, urls, f"saved {len(urls)} URL(s): " + ", ".join(mask_url(u) for u in urls), who)


def clear_notify_urls(state: AppState, who: str = oplog.PAGE) -> str:
    return _save_urls(state, (), "notification URLs cleared", who)


def _save_urls(state: AppState, urls: tuple[str, ...], ok: str, who: str) -> str:
    store = _store(state)
    try:
        cfg = store.read()
        store.write(ServiceConfig(cfg.restart_policy, urls, cfg.drain_grace_s))
    except OSError as exc:
        oplog.caught("service", exc, "saving the notification URLs", who=who)
        return f"not saved: cannot write {store.path} ({exc.strerror or exc})"
    oplog.decision("service", "setting_changed", who=who, setting="notify_urls",
                   new=" ".join(mask_url(u) for u in urls) or "(none)")
    return ok + (f" — {env.NOTIFY} is set and replaces this list while it is" if env.notify_urls() else "")


def drain_grace(state: AppState) -> float:
    """The drain grace in effect (the Service setting, else the recipe's)."""
    saved = _store(state).read().drain_grace_s
    return saved if saved is not None else float(state.settings.recipe.engine.drain_grace_s)


def set_drain_grace(state: AppState, value: float | None, who: str = oplog.PAGE) -> str:
    """How long a stop/switch waits for the answers in flight (docs/engine.md "Keeps serving"); None: the recipe's."""
    if value is not None and not 0 <= value <= 3600:
        return f"not saved: {value:g} s — the drain grace is 0 to 3600 seconds (0 = stop at once)"
    store = _store(state)
    cfg = store.read()
    try:
        store.write(ServiceConfig(cfg.restart_policy, cfg.notify_urls, value))
    except OSError as exc:
        oplog.caught("service", exc, "saving the drain grace", who=who)
        return f"not saved: cannot write {store.path} ({exc.strerror or exc})"
    oplog.decision("service", "setting_changed", who=who, setting="drain_grace_s", old=cfg.drain_grace_s,
                   new=value)
    return (f"drain grace saved: {value:g} s" if value is not None else
            f"drain grace: the recipe's {state.settings.recipe.engine.drain_grace_s:g} s")


def send_test(state: AppState, who: str = oplog.PAGE) -> str:
    if state.notifier is None:
        return "notifications are not available in this panel"
    answer = state.notifier.send_test()
    oplog.decision("service", "test_notification", who=who, result=answer)
    return answer


def non_healing_table() -> list[list[str]]:
    return [[k, why] for k, why in NON_HEALING.items()]
