"""Service tab: running unattended — restart policy, restarts, canary, notifications (docs/engine.md,
"Keeps serving"). Thin: everything goes through app.backend.service.panel."""

from __future__ import annotations

import html

import gradio as gr

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
    save_policy.click(lambda p: panel.set_policy(state, p), inputs=[policy], outputs=[note])
    save_urls.click(lambda t: (panel.set_notify_urls(state, t), ""), inputs=[urls], outputs=[note, urls])
    clear_urls.click(lambda: panel.clear_notify_urls(state), outputs=[note])
    test.click(lambda: panel.send_test(state), outputs=[note])
