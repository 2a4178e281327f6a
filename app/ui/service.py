"""Service tab: running unattended — restart policy, restarts, canary, notifications (docs/engine.md,
"Keeps serving"). Thin: everything goes through app.backend.service.panel."""

from __future__ import annotations

import html

import gradio as gr

from app.backend import oplog
from app.backend.service import panel
from app.backend.state import AppState
from app.ui.shell import Shell

TITLE = "Service"


def status_html(v: panel.ServiceView) -> str:
    gave = ' <b class="moet-badge-failed">gave up — start it again when fixed</b>' if v.gave_up else ""
    trying = f" (restart try {v.restart_try} pending)" if v.restart_try else ""
    rows = [
        ("Should run", v.desired),
        ("Engine", f"{v.state}{trying}{gave}"),
        ("Restart policy", f"{v.policy} <small>(from the {html.escape(v.policy_source)})</small>"),
        ("Restarts", f"{v.restarts_total} made by the panel · stalls seen: {v.stalls_total}"),
        ("Switches", f"{v.switches_ok} ok · {v.switches_failed} failed"),
        ("Generation canary", html.escape(v.canary)),
        ("Last note", html.escape(v.message) or "—"),
        ("Alerts go to", (", ".join(html.escape(t) for t in v.targets) or "nobody (add an Apprise URL below)")
         + f" <small>({html.escape(v.targets_source)})</small>"),
        ("Last messages", "<br>".join(html.escape(t) for t in v.sent) or "—"),
    ]
    body = "".join(f"<tr><th scope='row'>{k}</th><td>{val}</td></tr>" for k, val in rows)
    return f'<table class="moet-service" id="service-status">{body}</table>'


def render(state: AppState, shell: Shell) -> None:
    gr.Markdown("The panel keeps the engine serving when nobody watches: it brings back what should run after a "
                "reboot, restarts a crash or a hang (backoff, 3 tries in 15 min), and tells a person.")
    status = gr.HTML(status_html(panel.view(state)), elem_id="service-status-box")
    with gr.Row():
        policy = gr.Radio(["on-failure", "never"], value=panel.view(state).policy, label="Restart policy",
                          elem_id="service-policy")
        save_policy = gr.Button("Save policy", elem_id="service-save-policy")
        # a stop/switch first waits this long for the answers in flight (docs/engine.md "Keeps serving")
        # no minimum/maximum here: Gradio refuses an out-of-range value with a traceback in the panel's output
        # (issue 49); set_drain_grace says what is accepted instead
        grace = gr.Number(panel.drain_grace(state), label="Drain grace (s, 0–3600): answers in flight may finish",
                          elem_id="service-drain-grace")
        save_grace = gr.Button("Save grace", elem_id="service-save-grace")
    urls = gr.Textbox(label="Apprise URLs (space-separated; replaces the list; saved URLs are never shown back)",
                      type="password", placeholder="ntfy://ntfy.sh/my-topic  mailto://user:pass@example.com",
                      elem_id="service-urls")
    with gr.Row():
        save_urls = gr.Button("Save URLs", elem_id="service-save-urls")
        clear_urls = gr.Button("Clear", elem_id="service-clear-urls")
        test = gr.Button("Send a test", elem_id="service-test")
    note = gr.Markdown("", elem_id="service-note")
    with gr.Accordion("Failures a restart cannot heal (never retried)", open=False):
        gr.Dataframe(panel.non_healing_table(), headers=["diagnosis", "why not retried"], interactive=False)

    def refresh() -> str:
        return status_html(panel.view(state))

    # Pushed (the page feed, docs/ui-and-safety.md#the-page-feed): redrawn when what it shows changed, only while
    # the tab is shown; drawn at once when the tab opens, not page-load truth.
    shell.on_tick(refresh, None, [status])
    shell.version(refresh)
    shell.on_tab(TITLE, refresh, None, [status])
    # Each handler names who asked (the signed-in user, from Gradio's request) for the operator's log.
    def on_policy(p: str, request: gr.Request) -> str:
        return panel.set_policy(state, p, who=oplog.user(request.username))

    def on_urls(t: str, request: gr.Request) -> tuple[str, str]:
        return panel.set_notify_urls(state, t, who=oplog.user(request.username)), ""

    def on_clear(request: gr.Request) -> str:
        return panel.clear_notify_urls(state, who=oplog.user(request.username))

    def on_test(request: gr.Request) -> str:
        return panel.send_test(state, who=oplog.user(request.username))

    def on_grace(g: float | None, request: gr.Request) -> str:
        return panel.set_drain_grace(state, None if g is None else float(g), who=oplog.user(request.username))

    save_policy.click(on_policy, inputs=[policy], outputs=[note])
    save_grace.click(on_grace, inputs=[grace], outputs=[note])
    save_urls.click(on_urls, inputs=[urls], outputs=[note, urls])
    clear_urls.click(on_clear, outputs=[note])
    test.click(on_test, outputs=[note])
