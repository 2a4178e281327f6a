"""Chat tab: a thin Gradio layer over `state.chat` (app.backend.chat.service.ChatService).

Streaming design: the backend turn coalesces text; the generator re-renders only the reply's own
messages on top of a history prefix rendered once, and Gradio sends the browser an append-diff.
The update interval grows with the reply's size (display.py) so a 20k-token answer costs the
browser and the panel the same per 1k tokens at its end as at its start. Stop cancels the
generator; its `finally` closes the stream so the engine aborts the request.
"""

from __future__ import annotations

import html
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import gradio as gr
from gradio.context import Context

from app.backend.chat.display import THINKING_TAIL_CHARS, thinking_tail, update_interval
from app.backend.chat.client import SamplingParams
from app.backend.chat.models import Conversation, Message
from app.backend.chat.service import ChatError, ChatService
from app.backend.chat.stats import format_stats
from app.backend.chat.turn import TurnView
from app.backend.state import AppState
from app.ui.shell import Shell

TITLE = "Chat"
log = logging.getLogger("moet_panel.chat")
STREAM_CONCURRENCY = "chat-stream"  # own queue: a long answer never blocks the page timer or other tabs


class StreamEvent(TypedDict):
    concurrency_id: str
    concurrency_limit: int
    show_progress: Literal["hidden"]

# ---- rendering (pure functions: Conversation / TurnView -> Chatbot message dicts) -------------------


def _sub(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": f"<sub>{html.escape(text)}</sub>"}


def _thought(text: str, done: bool, seconds: float | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"title": "Thinking", "status": "done" if done else "pending"}
    if seconds is not None:
        meta["duration"] = round(seconds, 1)
    return {"role": "assistant", "content": text, "metadata": meta}


def render_message(msg: Message) -> list[dict[str, Any]]:
    if msg.role == "user":
        return [{"role": "user", "content": msg.content}]
    if msg.role != "assistant":
        return []
    out = []
    if msg.reasoning:
        out.append(_thought(msg.reasoning, True, msg.reasoning_s))
    if msg.content:
        out.append({"role": "assistant", "content": msg.content})
    if msg.status == "streaming":  # its live view is drawn by render_live
        out.append(_sub("waiting for the first token…"))
        return out
    stats = format_stats(msg.stats) if msg.stats else ""
    if msg.status == "stopped":
        out.append(_sub(f"Stopped — partial answer kept{' · ' + msg.error if msg.error else ''} · {stats}"))
    elif msg.status == "error":
        out.append({"role": "assistant", "content": f"**Error — the reply broke off:** {html.escape(msg.error)}"})
        out.append(_sub(stats))
    elif stats:
        out.append(_sub(stats + (f" · {msg.error}" if msg.error else "")))
    return out


def render_history(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for msg in messages:
        out.extend(render_message(msg))
    return out


def render_live(view: TurnView) -> list[dict[str, Any]]:
    """The streaming reply's messages: thinking (its tail while pending), answer, live stats line."""
    if view.done:
        return render_message(view.message)
    out = []
    if view.reasoning:
        answering = view.phase == "answering"
        out.append(_thought(view.reasoning if answering else thinking_tail(view.reasoning), answering,
                            view.reasoning_s))
    if view.content:
        out.append({"role": "assistant", "content": view.content})
    if view.phase == "waiting":
        out.append(_sub("waiting for the first token…"))
    else:
        live = [view.phase, f"{view.tokens} tokens"]
        if view.ttft_s is not None:
            live.append(f"TTFT {view.ttft_s:.2f} s")
        if view.rate is not None:
            live.append(f"{view.rate:.1f} tok/s")
        out.append(_sub(" · ".join(live)))
    return out


def on_screen_chars(view: TurnView) -> int:
    """What the browser redraws per update (a collapsed thought is not in the page)."""
    thinking = min(len(view.reasoning), THINKING_TAIL_CHARS) if view.phase == "thinking" else 0
    return thinking + len(view.content)


def conversation_choices(chat: ChatService) -> list[tuple[str, str]]:
    return [(s.title, s.id) for s in chat.list_conversations()]


def endpoint_line(chat: ChatService, custom_url: str) -> tuple[bool, str]:
    ep = chat.endpoint(custom_url or None)
    sim = " · **SIMULATED**" if ep.simulated else ""
    profile = f" · profile `{ep.profile_id}`" if ep.profile_id else ""
    where = f"`{ep.base_url}` · model `{ep.model}`{profile}{sim}"
    if ep.ready:
        return True, f"**Engine ready** — {where}"
    return False, f"**Chat is unavailable.** {ep.reason}  \n{where}"


# ---- the tab --------------------------------------------------------------------------------------


@dataclass
class Sidebar:
    """The conversation list and what acts on whole conversations."""

    convs: gr.Radio
    new_btn: gr.Button
    delete_btn: gr.Button
    rename_box: gr.Textbox
    export_json_btn: gr.Button
    export_md_btn: gr.Button
    export_file: gr.File
    import_btn: gr.UploadButton


@dataclass
class Thread:
    """The open conversation: readiness banner, messages, composer and turn buttons."""

    banner: gr.Markdown
    engine_btn: gr.Button
    bot: gr.Chatbot
    box: gr.Textbox
    send_btn: gr.Button
    stop_btn: gr.Button
    regen_btn: gr.Button
    edit_btn: gr.Button
    clear_btn: gr.Button
    edit_hint: gr.Markdown


@dataclass
class Tuning:
    """Sampling, system prompt, endpoint override and the API snippets they produce."""

    temp: gr.Slider
    top_p: gr.Slider
    min_p: gr.Slider
    max_tokens: gr.Number
    temp_warn: gr.Markdown
    system: gr.Textbox
    custom_url: gr.Textbox
    curl_code: gr.Code
    py_code: gr.Code

    @property
    def sampling_inputs(self) -> list[gr.Slider | gr.Number]:
        return [self.temp, self.top_p, self.min_p, self.max_tokens]


@dataclass
class ChatView:
    """The tab's components and per-page state, handed to the wiring functions."""

    conv_id: gr.State
    editing: gr.State
    ready_state: gr.State
    side: Sidebar
    thread: Thread
    tune: Tuning

    @property
    def conv_targets(self) -> list[gr.components.Component]:
        return [self.conv_id, self.side.convs, self.thread.bot, self.tune.system, self.editing, self.thread.edit_hint]


def sampling_of(t: float, p: float, m: float, n: float | None) -> SamplingParams:
    return SamplingParams(float(t), float(p), float(m), int(n) if n else None)


def render(state: AppState, shell: Shell) -> None:
    chat = state.chat
    if chat is None:
        gr.Markdown("Chat is not available: this panel runs without a chat service.")
        return
    v = _layout(chat)
    _wire_conversations(chat, v)
    _wire_replies(chat, v)
    _wire_settings(chat, v, shell)


def _layout(chat: ChatService) -> ChatView:
    conv_id = gr.State("")
    editing = gr.State(False)
    ready_state = gr.State(None)
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=230):
            side = _sidebar()
        with gr.Column(scale=4):
            thread = _thread()
            tune = _tuning(chat)
    return ChatView(conv_id, editing, ready_state, side, thread, tune)


def _sidebar() -> Sidebar:
    convs = gr.Radio(label="Conversations", choices=[], elem_id="chat-convs")
    with gr.Row():
        new_btn = gr.Button("New chat", size="sm", elem_id="chat-new")
        delete_btn = gr.Button("Delete", size="sm", variant="stop", elem_id="chat-delete")
    rename_box = gr.Textbox(label="Rename", placeholder="new title, Enter to save", elem_id="chat-rename")
    with gr.Row():
        export_json_btn = gr.Button("Export JSON", size="sm", elem_id="chat-export-json")
        export_md_btn = gr.Button("Export Markdown", size="sm", elem_id="chat-export-md")
    export_file = gr.File(label="Download", visible=False, interactive=False, elem_id="chat-export-file")
    import_btn = gr.UploadButton("Import JSON", file_types=[".json"], size="sm", elem_id="chat-import")
    return Sidebar(convs, new_btn, delete_btn, rename_box, export_json_btn, export_md_btn, export_file, import_btn)


def _thread() -> Thread:
    with gr.Row():
        banner = gr.Markdown("", elem_id="chat-banner")
        engine_btn = gr.Button("Open Engine tab", size="sm", visible=False, scale=0, elem_id="chat-goto-engine")
    bot = gr.Chatbot(
        show_label=False, height=560, latex_delimiters=[], buttons=["copy"], feedback_options=None,
        elem_id="chat-bot",
        placeholder="Ask the model something. Its thinking appears collapsed above the answer.",
    )
    with gr.Row():
        box = gr.Textbox(show_label=False, placeholder="Message (Enter to send, Shift+Enter for a new line)",
                         lines=1, max_lines=12, scale=6, elem_id="chat-input",  # lines=1: Enter sends
                         min_width=320)  # a 420 px window: the box gets its own line, Send + Stop the next
        send_btn = gr.Button("Send", variant="primary", scale=1, elem_id="chat-send")
        stop_btn = gr.Button("Stop", variant="stop", scale=1, elem_id="chat-stop")
    with gr.Row():
        regen_btn = gr.Button("Regenerate", size="sm", elem_id="chat-regen")
        edit_btn = gr.Button("Edit last message", size="sm", elem_id="chat-edit")
        clear_btn = gr.Button("Clear conversation", size="sm", elem_id="chat-clear")
    edit_hint = gr.Markdown("", elem_id="chat-edit-hint")
    return Thread(banner, engine_btn, bot, box, send_btn, stop_btn, regen_btn, edit_btn, clear_btn, edit_hint)


def _tuning(chat: ChatService) -> Tuning:
    d = chat.default_sampling()
    with gr.Accordion("Sampling and system prompt", open=False, elem_id="chat-sampling"):
        gr.Markdown(f"Defaults from the model card: *{html.escape(chat.sampling_note)}*")
        with gr.Row():
            temp = gr.Slider(0, 2, value=d.temperature, step=0.05, label="temperature", elem_id="chat-temp")
            top_p = gr.Slider(0.01, 1, value=d.top_p, step=0.01, label="top_p", elem_id="chat-top-p")
            min_p = gr.Slider(0, 1, value=d.min_p, step=0.01, label="min_p", elem_id="chat-min-p")
            max_tokens = gr.Number(value=d.max_tokens, precision=0, minimum=1, label="max tokens",
                                   elem_id="chat-max-tokens")
        temp_warn = gr.Markdown("", elem_id="chat-temp-warning")
        system = gr.Textbox(label="System prompt (this conversation)", lines=2, elem_id="chat-system")
        custom_url = gr.Textbox(label="Endpoint override (blank = the panel's engine)",
                                placeholder="http://127.0.0.1:8000", elem_id="chat-endpoint")
    with gr.Accordion("API snippets (current endpoint and sampling)", open=False):
        curl_code = gr.Code(language="shell", label="curl", interactive=False, elem_id="chat-curl")
        py_code = gr.Code(language="python", label="Python (openai)", interactive=False, elem_id="chat-python")
    return Tuning(temp, top_p, min_p, max_tokens, temp_warn, system, custom_url, curl_code, py_code)


def _full_view(chat: ChatService, cid: str) -> list[dict[str, Any]]:
    return render_history(chat.get(cid).messages) if cid else []


def _conv_outputs(chat: ChatService, conv: Conversation) -> tuple[Any, ...]:
    return (conv.id, gr.Radio(choices=conversation_choices(chat), value=conv.id),
            render_history(conv.messages), conv.system_prompt, False, "")


def _open_outputs(chat: ChatService, cid: str) -> tuple[Any, ...]:
    """Show one conversation; one that cannot be loaded or drawn (a damaged row, e.g. from an older
    import) shows why instead, stays selected and can be deleted: it never breaks the tab."""
    try:
        return _conv_outputs(chat, chat.get(cid))
    except ChatError:
        raise
    except Exception as exc:  # any failure inside one conversation's data: contain it to that conversation
        log.warning("chat: conversation %s cannot be shown: %s", cid, exc)
        shown = [{"role": "assistant", "content": f"**This conversation cannot be shown:** {html.escape(str(exc))}  \n"
                  "Delete it with **Delete** (other conversations are not affected)."}]
        return cid, gr.Radio(choices=conversation_choices(chat), value=cid), shown, "", False, ""


def _wire_conversations(chat: ChatService, v: ChatView) -> None:
    conv_targets = v.conv_targets

    # ---- page load / conversation management -----------------------------------------------------
    def on_load(cid: str) -> tuple[Any, ...]:
        summaries = chat.list_conversations()
        if summaries:
            return _open_outputs(chat, summaries[0].id)
        return _conv_outputs(chat, chat.new_conversation())

    root = Context.root_block
    if root is not None:
        root.load(on_load, [v.conv_id], conv_targets, api_name="chat_load")

    def on_select(cid: str) -> tuple[Any, ...]:
        return _open_outputs(chat, cid)

    def on_new() -> tuple[Any, ...]:
        return _conv_outputs(chat, chat.new_conversation())

    def on_rename(cid: str, title: str) -> tuple[Any, ...]:
        chat.rename(cid, title)
        return gr.Radio(choices=conversation_choices(chat), value=cid), ""

    def on_delete(cid: str, confirmed: bool) -> tuple[Any, ...]:
        if not confirmed:
            return tuple(gr.skip() for _ in conv_targets)
        chat.delete(cid)
        return on_load("")

    def on_clear(cid: str, confirmed: bool) -> tuple[Any, ...]:
        if not confirmed:
            return tuple(gr.skip() for _ in conv_targets)
        return _conv_outputs(chat, chat.clear(cid))

    def on_system(cid: str, text: str | None) -> None:
        if cid:
            try:
                chat.set_system_prompt(cid, text or "")
            except ChatError as exc:
                raise gr.Error(str(exc)) from None

    def on_export(cid: str, fmt: str) -> Any:
        return gr.File(value=str(chat.export_file(cid, fmt)), visible=True)

    def on_import(file: Any) -> tuple[Any, ...]:
        try:
            return _conv_outputs(chat, chat.import_file(file))
        except (ChatError, ValueError, OSError) as exc:
            raise gr.Error(f"Import failed: {exc}") from None

    confirm = gr.Checkbox(visible=False)
    v.side.convs.input(on_select, [v.side.convs], conv_targets, api_name="chat_select")
    v.side.new_btn.click(on_new, None, conv_targets, api_name="chat_new")
    v.side.rename_box.submit(on_rename, [v.conv_id, v.side.rename_box], [v.side.convs, v.side.rename_box], api_name="chat_rename")
    v.side.delete_btn.click(on_delete, [v.conv_id, confirm], conv_targets, api_name="chat_delete",
                            js="(c, x) => [c, confirm('Delete this conversation and its history?')]")
    v.thread.clear_btn.click(on_clear, [v.conv_id, confirm], conv_targets, api_name="chat_clear",
                             js="(c, x) => [c, confirm('Remove every message of this conversation?')]")
    v.tune.system.blur(on_system, [v.conv_id, v.tune.system], None)
    v.side.export_json_btn.click(lambda c: on_export(c, "json"), [v.conv_id], [v.side.export_file], api_name="chat_export_json")
    v.side.export_md_btn.click(lambda c: on_export(c, "md"), [v.conv_id], [v.side.export_file], api_name="chat_export_md")
    v.side.import_btn.upload(on_import, [v.side.import_btn], conv_targets, api_name="chat_import")


def _wire_replies(chat: ChatService, v: ChatView) -> None:
    sampling_inputs = v.tune.sampling_inputs
    # ---- sending and streaming ------------------------------------------------------------------
    def stream_turn(cid: str, turn: Any) -> Iterator[list[dict[str, Any]]]:
        """Chatbot values for a streaming reply; closing this generator (Stop) stops the reply."""
        prefix = render_history(chat.get(cid).messages[:-1])  # rendered once; the reply is the last message
        try:
            for view in turn.follow(interval_fn=lambda v: update_interval(on_screen_chars(v))):
                yield prefix + render_live(view)
        finally:
            if not turn.done.is_set():  # Stop pressed, conversation switched or page closed
                turn.stop(timeout=0)

    def on_send(cid: str, text: str, is_edit: bool, sys_prompt: str | None, url: str, t: float, p: float,
                m: float, n: float | None):
        # One event does send + stream: a second chained event would add a queue round trip to TTFT.
        sampling = sampling_of(t, p, m, n)
        try:  # retitle: the first message names the conversation
            turn, retitle = chat.send_composed(cid, text, sampling, edit=bool(is_edit), system_prompt=sys_prompt or "",
                                               custom_url=url or None)
        except ChatError as exc:
            raise gr.Error(str(exc)) from None
        skip = gr.skip()
        value: Any = skip
        for i, value in enumerate(stream_turn(cid, turn)):
            if i == 0:  # first frame: only what must change now (the conversation list can wait a frame)
                yield "", value, (False if is_edit else skip), ("" if is_edit else skip), skip
            elif retitle:
                retitle = False
                yield skip, value, skip, skip, gr.Radio(choices=conversation_choices(chat), value=cid)
            else:
                yield skip, value, skip, skip, skip
        if retitle:  # the reply ended within its first frame
            yield skip, skip, skip, skip, gr.Radio(choices=conversation_choices(chat), value=cid)

    def on_regen(cid: str, url: str, t: float, p: float, m: float, n: float | None):
        try:
            turn = chat.regenerate(cid, sampling_of(t, p, m, n), custom_url=url or None)
        except ChatError as exc:
            raise gr.Error(str(exc)) from None
        yield from stream_turn(cid, turn)

    def on_stop(cid: str) -> list[dict[str, Any]]:
        chat.stop(cid)
        return _full_view(chat, cid)

    send_inputs = [v.conv_id, v.thread.box, v.editing, v.tune.system, v.tune.custom_url, *sampling_inputs]
    send_outputs = [v.thread.box, v.thread.bot, v.editing, v.thread.edit_hint, v.side.convs]
    stream_kw = StreamEvent(concurrency_id=STREAM_CONCURRENCY, concurrency_limit=chat.max_streams,
                            show_progress="hidden")
    streams: list[dict[str, Any]] = [  # Gradio's `cancels` is typed as dicts; a Dependency is one
        v.thread.box.submit(on_send, send_inputs, send_outputs, api_name="chat_send", **stream_kw),
        v.thread.send_btn.click(on_send, send_inputs, send_outputs, api_visibility="private", **stream_kw),
        v.thread.regen_btn.click(on_regen, [v.conv_id, v.tune.custom_url, *sampling_inputs], [v.thread.bot],
                                 api_name="chat_regenerate", **stream_kw),
    ]
    v.thread.stop_btn.click(on_stop, [v.conv_id], [v.thread.bot], cancels=streams, api_name="chat_stop",
                            concurrency_limit=None, show_progress="hidden")
    # Leaving the conversation ends its live view (and, through `finally`, the reply).
    for trigger in (v.side.convs.input, v.side.new_btn.click):
        trigger(None, None, None, cancels=streams, queue=False)

    def on_edit(cid: str, is_edit: bool) -> tuple[Any, ...]:
        if is_edit:  # second click cancels editing
            return "", False, ""
        text = chat.last_user_text(cid)
        if not text:
            raise gr.Error("There is no message to edit yet.")
        return text, True, "**Editing your last message** — **Send** replaces it and regenerates the answer. " \
                           "Click *Edit last message* again to cancel."

    v.thread.edit_btn.click(on_edit, [v.conv_id, v.editing], [v.thread.box, v.editing, v.thread.edit_hint], api_name="chat_edit")


def _wire_settings(chat: ChatService, v: ChatView, shell: Shell) -> None:
    root = Context.root_block
    sampling_inputs = v.tune.sampling_inputs
    # ---- sampling warning, snippets, readiness --------------------------------------------------
    def on_sampling(t: float, p: float, m: float, n: float | None, sys_prompt: str, url: str) -> tuple[str, str, str]:
        sampling, sys_prompt = sampling_of(t, p, m, n), sys_prompt or ""
        warn = "".join(f"**Warning — {html.escape(w)}**\n" for w in chat.sampling_warnings(sampling))
        curl, py = chat.snippets(sampling, sys_prompt, custom_url=url or None)
        return warn, curl, py

    sampling_args = [*sampling_inputs, v.tune.system, v.tune.custom_url]
    snippet_outputs = [v.tune.temp_warn, v.tune.curl_code, v.tune.py_code]
    for comp in (*sampling_inputs, v.tune.system, v.tune.custom_url):
        comp.change(on_sampling, sampling_args, snippet_outputs, show_progress="hidden", trigger_mode="always_last",
                    api_visibility="private")
    if root is not None:
        root.load(on_sampling, sampling_args, snippet_outputs, api_visibility="private")

    def on_tick(url: str, last: Any) -> tuple[Any, ...]:
        ready, line = endpoint_line(chat, url)
        if last == (ready, line):  # nothing changed: send nothing (this runs every second per open page)
            return (*(gr.skip() for _ in tick_outputs[:-1]), last)
        return (line, gr.Button(visible=not ready), gr.Textbox(interactive=ready), gr.Button(interactive=ready),
                gr.Button(interactive=ready), (ready, line))

    t = v.thread
    tick_outputs = [t.banner, t.engine_btn, t.box, t.send_btn, t.regen_btn, v.ready_state]
    shell.timer.tick(on_tick, [v.tune.custom_url, v.ready_state], tick_outputs, concurrency_id="chat-ready",
                     concurrency_limit=None, show_progress="hidden", api_visibility="private")
    # The endpoint changed (engine started, profile switched): so do the snippets.
    v.ready_state.change(on_sampling, sampling_args, snippet_outputs, show_progress="hidden", api_visibility="private")
    if root is not None:
        root.load(on_tick, [v.tune.custom_url, v.ready_state], tick_outputs, api_visibility="private")
    v.thread.engine_btn.click(lambda: gr.Tabs(selected="engine"), None, shell.tabs, api_visibility="private")

