"""Downloads tab: artifact list with live progress bars, controls, disk picture, token, ckpt-id check.

Thin: every action calls `state.downloads` (DownloadManager); the page timer reads its cached snapshot.
"""

from __future__ import annotations

import html
from collections.abc import Callable

import gradio as gr

from app.backend import oplog
from app.backend.download.manager import DownloadManager
from app.backend.download.types import ArtifactProgress, ArtifactState, DownloadSnapshot
from app.backend.state import AppState
from app.backend.contracts import duration_text, size_pair_text, size_text
from app.ui.shell import Shell

TITLE = "Downloads"


def fmt_rate(bps: float) -> str:
    return f"{size_text(bps)}/s" if bps > 0 else "—"


def _badge(a: ArtifactProgress) -> str:
    if a.stalled:
        return '<span class="st stalled">stalled · 0 GiB/s</span>'
    cls = {ArtifactState.DONE: "done", ArtifactState.FAILED: "failed", ArtifactState.PAUSED: "paused",
           ArtifactState.CANCELLED: "paused", ArtifactState.QUEUED: "queued"}.get(a.state, "run")
    return f'<span class="st {cls}">{a.state.value}</span>'


def _bar(a: ArtifactProgress) -> str:
    total = max(a.total_bytes, 1)
    active = a.state.active
    verified = min(a.verified_bytes / total, 1)
    # fetched but not yet verified counts only while it runs: a pause keeps verified parts only (docs/downloads.md),
    # so a paused bar beside "0/15 parts verified" reads 0 %, not the 30 % fetched before the pause (issue 49)
    fetched = min(a.fetched_bytes / total, 1) if active else verified
    cls = "track" + (" active" if active else "") + (" stalled" if a.stalled else "")
    label = f"{a.id} progress: {verified * 100:.0f}% verified"
    return (f'<div class="{cls}" role="progressbar" aria-label="{html.escape(label)}" aria-valuemin="0" '
            f'aria-valuemax="100" aria-valuenow="{verified * 100:.0f}"><div class="fetched" style="width:{fetched * 100:.1f}%"></div>'
            f'<div class="verified" style="width:{verified * 100:.1f}%"></div></div>')


def _row(a: ArtifactProgress) -> str:
    rate = "stalled" if a.stalled else fmt_rate(a.rate_bps)
    why = f'<div class="why">{html.escape(a.reason)}</div>' if a.reason else ""
    part = f'<div class="why">part {html.escape(a.current_part)}</div>' if a.current_part and a.state.active else ""
    limit = f'<div class="why">limit: <b>{a.binding.value}</b></div>' if a.binding and a.state.active else ""
    rates = (f'<div class="why">{fmt_rate(a.verified_bps)} verified · {fmt_rate(a.extracted_bps)} extracted</div>'
             if a.state.active else "")
    eta = duration_text(a.eta_s) if a.state.active else "—"  # paused, cancelled, failed, queued: no ETA
    skipped = f" · {a.skipped_files} already complete" if a.skipped_files else ""
    size = size_pair_text(a.verified_bytes, a.total_bytes) if a.total_bytes else "not listed yet (Check repo)"
    # data-label: a narrow window shows each row as a card, each cell under its column's name (panel.css)
    return (f'<tr><td data-label="artifact"><b>{html.escape(a.id)}</b>{part}</td><td data-label="state">{_badge(a)}{why}</td>'
            f'<td data-label="progress">{_bar(a)}</td>'
            f'<td class="num" data-label="verified">{size}<div class="why">'
            f"{a.parts_verified}/{a.parts_total} parts verified · {size_text(a.wire_bytes)} on the wire</div></td>"
            f'<td class="num" data-label="extracted">{a.extracted_files} files<div class="why">{size_text(a.extracted_bytes)} written'
            f"{skipped}</div></td>"
            f'<td class="num" data-label="rate (wire)">{rate}{rates}</td><td class="num" data-label="ETA">{eta}{limit}</td></tr>')


def artifacts_html(snap: DownloadSnapshot) -> str:
    rows = [_row(a) for a in snap.artifacts]
    total, verified = snap.total_bytes, snap.verified_bytes
    limit = f'<div class="why">limit: <b>{snap.binding.value}</b></div>' if snap.binding and snap.running else ""
    rates = (f'<div class="why">{fmt_rate(snap.verified_bps)} verified · {fmt_rate(snap.extracted_bps)} extracted</div>'
             if snap.running else "")
    rows.append(f'<tr><td data-label="artifact"><b>total</b></td><td class="empty"></td><td class="empty"></td>'
                f'<td class="num" data-label="verified">{size_pair_text(verified, total)}</td>'
                f'<td class="num" data-label="extracted">{sum(a.extracted_files for a in snap.artifacts)} files<div class="why">'
                f"{size_text(sum(a.extracted_bytes for a in snap.artifacts))} written</div></td>"
                f'<td class="num" data-label="rate (wire)">{fmt_rate(snap.rate_bps)}{rates}</td>'
                f'<td class="num" data-label="ETA">{duration_text(snap.eta_s) if snap.running else "—"}{limit}</td></tr>')
    sim = '<span class="moet-sim-tag">SIMULATED</span> ' if snap.simulated else ""
    head = (f'<p>{sim}Source: <code>{html.escape(snap.repo)}</code>'
            f'{f" @ commit <code>{html.escape(snap.commit[:12])}</code>" if snap.commit else ""}'
            f'{" — running" if snap.running else ""}</p>')
    table = ("<table class=\"moet-stack\"><thead><tr><th>artifact</th><th>state</th><th>progress</th><th>verified</th>"
             "<th>extracted</th><th>rate (wire)</th><th>ETA</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    return f'<div class="moet-dl" id="moet-dl-artifacts">{head}{table}</div>'


def disk_html(snap: DownloadSnapshot) -> str:
    d = snap.disk
    if d is None:
        return ""
    budget = f" · staging budget <b>{size_text(d.staging_budget)}</b> (adapts to free disk; used {size_text(d.staging_used)})" \
        if d.staging_budget else ""
    peak = f" · peak staging <b>{size_text(d.staging_peak)}</b>" if d.staging_peak else ""
    warn = " — <b>not enough space</b>" if d.free < d.needed else ""
    return (f'<div class="moet-dl"><p>Disk <code>{html.escape(d.path)}</code>: free <b>{size_text(d.free)}</b> · '
            f"needed <b>{size_text(d.needed)}</b>{budget}{peak}{warn}</p></div>")


def idle_text(snap: DownloadSnapshot) -> str:
    """The status line when nothing runs, agreeing with the rows' badges (issue 29: "Idle." beside "queued")."""
    states = [a.state for a in snap.artifacts]
    if not states:
        return "Idle: no artifact listed yet (Check repo)."
    if all(st is ArtifactState.DONE for st in states):
        return "Idle: every artifact is downloaded and verified."
    waiting = sum(st is ArtifactState.QUEUED for st in states)
    if waiting:
        return f"Idle: {waiting} artifact{'s' if waiting != 1 else ''} queued, not started — press Start."
    return "Idle: press Resume to continue, or Start."


def _tick(dl: DownloadManager) -> tuple[str, str, str, str]:
    snap = dl.snapshot()
    ck = dl.ckpt_check()
    ck_html = (f'<div class="moet-dl"><p>ckpt-id check (planescache meta.json vs recipe pin): '
               f'<span class="st {"done" if ck.status == "match" else "failed" if ck.status == "mismatch" else "queued"}">'
               f"{ck.status.replace('_', ' ')}</span> {html.escape(ck.message)}</p></div>")
    status = f"**Error:** {snap.error}" if snap.error else (snap.message or idle_text(snap))
    return artifacts_html(snap), disk_html(snap), ck_html, status


def render(state: AppState, shell: Shell) -> None:
    dl = state.downloads
    if dl is None:
        gr.Markdown("Downloads are not available: this panel runs without a download manager.")
        return
    gr.Markdown(f"Resumable, verified downloads of the recipe's artifacts from **{html.escape(dl.source)}**. "
                "Every part is checked against the Hub's sha256 before extraction.")
    with gr.Row():
        start = gr.Button("Start", variant="primary", elem_id="dl-start")
        pause = gr.Button("Pause", elem_id="dl-pause")
        resume = gr.Button("Resume", elem_id="dl-resume")
        cancel = gr.Button("Cancel", variant="stop", elem_id="dl-cancel")
        refresh = gr.Button("Check repo", elem_id="dl-refresh")
        clean = gr.Button("Clean partial data", elem_id="dl-clean")
    status = gr.Markdown("Idle.", elem_id="dl-status")
    table = gr.HTML(elem_id="dl-table")
    disk = gr.HTML(elem_id="dl-disk")
    ckpt = gr.HTML(elem_id="dl-ckpt")
    with gr.Accordion("Hugging Face token", open=False):
        gr.Markdown(f"Current: {dl.token_status()}. Stored with mode 0600 under ~/.config/moet-panel/, never shown again.")
        token = gr.Textbox(label="Hugging Face token", type="password", placeholder="hf_…", elem_id="dl-token")
        save = gr.Button("Save token", elem_id="dl-token-save")
        token_msg = gr.Markdown()
    outs = [table, disk, ckpt, status]
    def asked(fn: Callable[..., str]) -> Callable[[gr.Request], str]:
        """The button's action with who asked (the signed-in user) for the operator's log."""
        def handler(request: gr.Request) -> str:
            return fn(who=oplog.user(request.username))
        return handler

    for btn, fn in ((start, asked(dl.start)), (pause, asked(dl.pause)), (resume, asked(dl.resume)),
                    (cancel, asked(dl.cancel)), (refresh, lambda: dl.refresh()), (clean, asked(dl.clean))):
        btn.click(fn, outputs=status, concurrency_limit=None, api_visibility="private").then(lambda: _tick(dl), outputs=outs)

    def on_save(t: str, request: gr.Request) -> tuple[str, str]:
        return "", dl.save_token(t or "", who=oplog.user(request.username))

    save.click(on_save, inputs=token, outputs=[token, token_msg], api_visibility="private")
    shell.on_tick(lambda: _tick(dl), None, outs)
    shell.version(lambda: _tick(dl))
