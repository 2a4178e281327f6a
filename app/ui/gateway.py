"""Access tab: the API gateway — the only way to the model from other machines (docs/gateway.md).

Thin: the switch, keys and activity are `state.gateway` (app/backend/gateway/switch.py); snippets come from
app/backend/gateway/snippets.py. A new key is shown once, in a box with a copy button, and never again
(only its hash is stored). Inference keys grant nothing of this panel.
"""

from __future__ import annotations

import html
import time
from typing import Any

import gradio as gr

from app.backend.gateway.caps import CapsError
from app.backend.gateway.keys import PANEL_CHAT_KEY, ActivityRecord, KeyInfo, KeyStoreError
from app.backend.gateway.switch import GatewayService, GatewaySnapshot, GatewayState, GatewayView
from app.backend.gateway.snippets import curl_snippet, openai_snippet
from app.backend.state import AppState
from app.ui.shell import QUICK, Shell

TITLE = "Access"


def _t(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "–"


def status_html(view: GatewayView) -> str:
    s = view.snapshot
    word = {GatewayState.ON: "on", GatewayState.OFF: "off", GatewayState.STARTING: "starting",
            GatewayState.FAILED: "failed"}[s.state]
    engine = "engine ready" if s.engine_ready else f"engine not ready — clients get 503: {s.engine_reason}"
    where = (f'<code id="gw-url">{html.escape(s.url)}/v1</code>' if s.state is GatewayState.ON
             else f"would listen on <code>{html.escape(s.url)}</code>")
    proc = f" The gateway runs as its own process (pid {s.pid}), stopped with the panel." if s.pid else ""
    proc += queue_line(s) + caps_line(s)
    return (f'<div id="gw-status" class="moet-gw-status" data-state="{word}" data-restored="{int(s.restored)}">'
            f"<b>Gateway: {word}</b> — {where}<br>"
            f"{html.escape(s.message)}<br><small>{html.escape(engine)}. "
            "The engine itself listens on a unix socket of the panel only (no TCP port)."
            f"{proc}</small></div>")


def queue_line(s: GatewaySnapshot) -> str:
    """The fair queue's figures, and on a box of several GPUs where requests go (docs/gateway.md)."""
    wait = f"; mean wait {s.queue_wait_mean_s:.2f} s" if s.queue_wait_mean_s is not None else ""
    out = f'<br><span id="gw-queue" data-queue="{s.queue_length}">Queue: {s.queue_length} waiting{wait}.</span>'
    if s.serving_gpus or s.in_flight_gpu:
        busy = ", ".join(f"GPU {g}: {n}" for g, n in s.in_flight_gpu) or "none"
        out += (f' <span id="gw-gpus">Serving GPUs: {", ".join(map(str, s.serving_gpus)) or "none"}; '
                f"answers in flight {busy}.</span>")
    return out


def caps_line(s: GatewaySnapshot) -> str:
    """The caps in force (docs/gateway.md#caps), as the owner set them or the recipe's defaults."""
    return (f'<br><span id="gw-caps" data-max-tokens="{s.max_tokens}" data-hold="{s.max_hold_s:g}">Caps: a request '
            f"may ask at most {s.max_tokens:,} tokens (a key's own cap wins); a key holds the engine at most "
            f"{s.max_hold_s:g} s while another waits; an answer whose client reads nothing for {s.stall_s:g} s is cut."
            "</span>")


def _cap_cell(k: KeyInfo) -> str:
    return f"{k.max_tokens:,}" if k.max_tokens is not None else "gateway's"


# the panel's own key for its Chat tab, listed so chat shows in the usage (docs/chat.md "Taking turns")
_CHAT_NOTE = ' <small title="made by the panel while the gateway serves: the Chat tab takes its turn with it">(Chat tab)</small>'


def keys_html(keys: tuple[KeyInfo, ...]) -> str:
    if not keys:
        return '<p id="gw-keys">No keys yet. Create one below; clients send it as <code>Authorization: Bearer …</code>.</p>'
    rows = "".join(
        f"<tr data-key='{html.escape(k.name)}'><td>{html.escape(k.name)}{_CHAT_NOTE if k.name == PANEL_CHAT_KEY else ''}"
        f"</td><td>{html.escape(k.hint)}</td>"
        f"<td>{k.status}</td><td>{_cap_cell(k)}</td><td>{k.usage.requests}</td><td>{k.usage.prompt_tokens}</td>"
        f"<td>{k.usage.completion_tokens}</td><td>{k.usage.errors}</td><td>{_t(k.usage.last_used)}</td>"
        f"<td>{_t(k.expires) if k.expires else 'never'}</td></tr>" for k in keys)
    return ('<table id="gw-keys" class="moet-table"><thead><tr><th>name</th><th>key starts</th><th>status</th>'
            "<th>max tokens</th><th>requests</th><th>prompt tok</th><th>completion tok</th><th>errors</th><th>last used</th>"
            f"<th>expires</th></tr></thead><tbody>{rows}</tbody></table>")


def activity_html(acts: tuple[ActivityRecord, ...]) -> str:
    if not acts:
        return '<p id="gw-activity">No requests yet.</p>'

    def f(x: float | None, fmt: str) -> str:
        return format(x, fmt) if x is not None else "–"

    rows = "".join(
        f"<tr><td>{_t(a.time)}</td><td>{html.escape(a.key_name)}</td><td>{html.escape(a.route)}</td>"
        f"<td>{a.status}</td><td>{a.prompt_tokens if a.prompt_tokens is not None else '–'} / "
        f"{a.completion_tokens if a.completion_tokens is not None else '–'}</td>"
        f"<td>{f(a.ttft_s * 1000 if a.ttft_s is not None else None, '.0f')}</td><td>{f(a.duration_s, '.2f')}</td>"
        f"<td>{f(a.tok_s, '.1f')}</td><td>{html.escape(a.error)}</td></tr>" for a in acts)
    return ('<table id="gw-activity" class="moet-table"><thead><tr><th>time</th><th>key</th><th>route</th><th>status</th>'
            "<th>tokens in / out</th><th>TTFT ms</th><th>duration s</th><th>tok/s</th><th>note</th></tr></thead>"
            f"<tbody>{rows}</tbody></table><small>Metadata only (no prompts or answers unless body capture is on).</small>")


def _active_names(view: GatewayView) -> list[str]:
    # the panel's own chat key is not the owner's to revoke: it comes and goes with the gateway (docs/chat.md)
    return [k.name for k in view.keys if k.status == "active" and k.name != PANEL_CHAT_KEY]


def render(state: AppState, shell: Shell) -> None:
    gw = state.gateway
    if gw is None:
        gr.Markdown("The API gateway is not available in this panel.")
        return
    svc: GatewayService = gw
    model = state.settings.recipe.model.served_name
    gr.Markdown("Serve the model to other machines (an IDE, Open WebUI, scripts) through the **API gateway**: "
                "per-client keys, limits, usage and activity. "
                "The engine itself listens on a unix socket of the panel, no TCP port. "
                "What is reachable, by whom, with what: `docs/gateway.md`.")
    view0 = svc.view()
    with gr.Row():
        switch = gr.Checkbox(view0.snapshot.state is GatewayState.ON, label="Gateway on", elem_id="gw-switch")
    status = gr.HTML(status_html(view0), elem_id="gw-status-box")
    with gr.Accordion("Client snippets (replace YOUR_KEY with a key)", open=False):
        py = gr.Code(openai_snippet(view0.snapshot.url, model), language="python", label="Python (openai)",
                     interactive=False, elem_id="gw-python")
        curl = gr.Code(curl_snippet(view0.snapshot.url, model), language="shell", label="curl",
                       interactive=False, elem_id="gw-curl")
    snap0 = view0.snapshot
    # numbers are checked by the backend, not by Gradio bounds (an out-of-range value printed a traceback, issue 49)
    with gr.Accordion("Caps for keys without their own (docs/gateway.md#caps)", open=False, elem_id="gw-caps-box"):
        with gr.Row():
            cap_tokens = gr.Number(snap0.max_tokens, label="Max tokens a request (0 = the recipe's default)",
                                   elem_id="gw-cap-tokens")
            cap_hold = gr.Number(snap0.max_hold_s, label="Hold cap: seconds a key may hold the engine while "
                                 "another waits (0 = the default)", elem_id="gw-cap-hold")
            save_caps = gr.Button("Save caps", elem_id="gw-save-caps")
        caps_note = gr.Markdown("A running gateway applies them to the next request; answers running go on.",
                                elem_id="gw-caps-note")
    gr.Markdown("### Keys")
    with gr.Row():
        name = gr.Textbox(label="New key name", placeholder="laptop, open-webui, ci…", elem_id="gw-key-name")
        days = gr.Number(0, label="Expires after days (0 = never, at most 3650)", elem_id="gw-key-days")
        key_cap = gr.Number(0, label="Its max tokens a request (0 = the gateway's cap)", elem_id="gw-key-cap")
        create = gr.Button("Create key", variant="primary", elem_id="gw-create")
    shown = gr.Textbox(label="The new key — copy it now: it is shown once and never again", visible=False,
                       interactive=False, buttons=["copy"], elem_id="gw-new-key")
    note = gr.Markdown(elem_id="gw-note")
    with gr.Row():
        revoke_name = gr.Dropdown(_active_names(view0), label="Key", elem_id="gw-revoke-name")
        set_cap = gr.Number(0, label="Its max tokens (0 = the gateway's cap)", elem_id="gw-set-cap-tokens")
        set_cap_btn = gr.Button("Set its cap", elem_id="gw-set-cap")
        revoke = gr.Button("Revoke", variant="stop", elem_id="gw-revoke")
    keys = gr.HTML(keys_html(view0.keys), elem_id="gw-keys-box")
    gr.Markdown("### Recent requests")
    activity = gr.HTML(activity_html(view0.activity), elem_id="gw-activity-box")

    def refresh(view: GatewayView | None = None) -> tuple[Any, ...]:
        v = view or svc.view()
        names = _active_names(v)
        return (status_html(v), keys_html(v.keys), activity_html(v.activity), gr.update(choices=names),
                openai_snippet(v.snapshot.url, model), curl_snippet(v.snapshot.url, model))

    outs = [status, keys, activity, revoke_name, py, curl]

    # The page timer keeps the revoke list in step with keys made elsewhere (the CLI, another page) without
    # closing an open list each second (choices change only when the active names do), and the switch with
    # the gateway's real state on a page opened or reloaded after the build.
    names_seen = gr.State(_active_names(view0))
    on_seen = gr.State(view0.snapshot.state is GatewayState.ON)

    def on_switch(on: bool) -> tuple[Any, ...]:
        snap = svc.start() if on else svc.stop()
        return (gr.update(value=snap.state is GatewayState.ON), snap.state is GatewayState.ON, *refresh())

    def on_create(key_name: str, expires: float | None, cap: float | None) -> tuple[Any, ...]:
        try:
            created = svc.create_key((key_name or "").strip(), float(expires) if expires else None,
                                     max_tokens=cap or None)  # 0 or empty: the gateway's cap
        except KeyStoreError as exc:
            return (gr.update(value="", visible=False), f"⚠ {exc}", gr.update(), *refresh())
        return (gr.update(value=created.key, visible=True),
                f"Key **{html.escape(created.name)}** created. Copy it now: it is stored only as a hash.", "", *refresh())

    def on_set_cap(key_name: str | None, cap: float | None) -> tuple[Any, ...]:
        if not key_name:
            return ("Pick a key to set its cap.", *refresh())
        try:
            ok = svc.set_key_max_tokens(key_name, cap or None)  # 0 or empty: the gateway's cap
        except KeyStoreError as exc:
            return (f"⚠ {exc}", *refresh())
        its = f"{int(cap):,} tokens" if cap else "the gateway's cap"
        msg = (f"Key **{html.escape(key_name)}** may now ask {its} a request (applied within a second)." if ok
               else f"No active key named {html.escape(key_name)}.")
        return (msg, *refresh())

    def on_save_caps(tokens: float | None, hold: float | None) -> tuple[Any, ...]:
        try:
            caps = svc.set_caps(tokens or None, hold or None)  # 0 or empty: the default
        except CapsError as exc:
            return (f"⚠ {exc}", gr.update(), gr.update(), *refresh())
        return (f"Saved: {caps.max_tokens:,} tokens a request, hold cap {caps.max_hold_s:g} s; a running gateway "
                "applies them to the next request.", caps.max_tokens, caps.max_hold_s, *refresh())

    def on_revoke(key_name: str | None) -> tuple[Any, ...]:
        if not key_name:
            return ("Pick a key to revoke.", *refresh())
        ok = svc.revoke_key(key_name)
        msg = (f"Key **{html.escape(key_name)}** revoked: the gateway refuses it within a second." if ok
               else f"No active key named {html.escape(key_name)}.")
        return (msg, *refresh())

    switch.input(on_switch, [switch], [switch, on_seen, *outs], **QUICK)
    create.click(on_create, [name, days, key_cap], [shown, note, name, *outs], **QUICK)
    set_cap_btn.click(on_set_cap, [revoke_name, set_cap], [note, *outs], **QUICK)
    save_caps.click(on_save_caps, [cap_tokens, cap_hold], [caps_note, cap_tokens, cap_hold, *outs], **QUICK)
    revoke.click(on_revoke, [revoke_name], [note, *outs], **QUICK)

    def on_tick(seen: list[str], was_on: bool) -> tuple[Any, ...]:
        v = svc.view()
        names = _active_names(v)
        is_on = v.snapshot.state is GatewayState.ON
        out = refresh(v)
        return (*out[:3], gr.update(choices=names) if names != seen else gr.update(), names,
                gr.update(value=is_on) if is_on != was_on else gr.update(), is_on)

    shell.version(lambda: refresh()[:4])
    shell.timer.tick(on_tick, [names_seen, on_seen],
                     [status, keys, activity, revoke_name, names_seen, switch, on_seen], **QUICK)
