"""Chat tab: a thin Gradio layer over `state.chat` (app.backend.chat.conversations.ChatService).

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

from app.backend.chat.display import (
    MAX_SHOWN_MESSAGES, PLAIN_PREVIEW_CHARS, THINKING_TAIL_CHARS, RenderBudget, bounded, thinking_tail,
    update_interval,
)
from app.backend.chat.client import SamplingParams
from app.backend.chat.models import Conversation, Message
from app.backend.chat.conversations import ChatError, ChatService, ConversationMoved
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


STOPPED_MARK = "**Stopped — this answer is incomplete.**"
STOP_WAIT_S = 30.0  # how long Stop waits for the reply to be final (on_stop)
EDIT_LABEL, CANCEL_EDIT_LABEL = "Edit last message", "Cancel edit"


def _sub(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": f"<sub>{html.escape(text)}</sub>"}


def _thought(text: str, done: bool, seconds: float | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"title": "Thinking", "status": "done" if done else "pending"}
    if seconds is not None:
        meta["duration"] = round(seconds, 1)
    return {"role": "assistant", "content": text, "metadata": meta}


def render_message(msg: Message, budget: RenderBudget | None = None) -> list[dict[str, Any]]:
    """One stored message as Chatbot messages. Every text goes through `budget` (display.py): over
    its limits it is shown as bounded plain text, so no message can stall the browser's renderer."""
    budget = budget if budget is not None else RenderBudget()

    def show(text: str) -> str:
        shown, plain = bounded(text, budget)
        budget.plain += plain
        return shown

    if msg.role == "user":
        return [{"role": "user", "content": show(msg.content)}]
    if msg.role != "assistant":
        return []
    out = []
    if msg.reasoning:
        out.append(_thought(show(msg.reasoning), True, msg.reasoning_s))
    if msg.content:
        out.append({"role": "assistant", "content": show(msg.content)})
    if msg.status == "streaming":  # its live view is drawn by render_live
        out.append(_sub("waiting for the first token…"))
        return out
    stats = format_stats(msg.stats) if msg.stats else ""
    if msg.status == "stopped":  # its own line, not the stats' small print: it must not read as finished (issue 49)
        out.append({"role": "assistant", "content": STOPPED_MARK})
        out.append(_sub(" · ".join(x for x in ("partial answer kept", msg.error[:2000], stats) if x)))
    elif msg.status == "error":
        out.append({"role": "assistant",
                    "content": f"**Error — the reply broke off:** {html.escape(msg.error[:PLAIN_PREVIEW_CHARS])}"})
        out.append(_sub(stats))
    elif stats:
        out.append(_sub(stats + (f" · {msg.error[:2000]}" if msg.error else "")))
    return out


@dataclass(frozen=True)
class HistoryView:
    messages: list[dict[str, Any]]
    plain: int  # messages shown as plain text (over the limits): the page offers "render as Markdown"


def history_view(messages: list[Message], full: bool = False) -> HistoryView:
    """A conversation as Chatbot messages within one page budget, spent newest first (what a person
    reads first renders as Markdown); at most MAX_SHOWN_MESSAGES messages unless `full`."""
    budget = RenderBudget(full=full)
    shown = messages if full else messages[-MAX_SHOWN_MESSAGES:]
    groups = [render_message(m, budget) for m in reversed(shown)]
    out = [item for group in reversed(groups) for item in group]
    hidden = len(messages) - len(shown)
    if hidden:
        out.insert(0, _sub(f"{hidden:,} earlier messages are not shown (export the conversation to read them all, "
                           "or tick 'Render long messages as Markdown' to show everything)"))
    return HistoryView(out, budget.plain + (1 if hidden else 0))


def render_history(messages: list[Message], full: bool = False) -> list[dict[str, Any]]:
    return history_view(messages, full).messages


def render_live(view: TurnView, full: bool = False) -> list[dict[str, Any]]:
    """The streaming reply's messages: thinking (its tail while pending), answer, live stats line.
    A reply over the render limits streams as plain text (its tail), like a stored one."""
    budget = RenderBudget(full=full)
    if view.done:
        return render_message(view.message, budget)
    out = []
    if view.reasoning:
        answering = view.phase == "answering"
        thinking = view.reasoning if answering else thinking_tail(view.reasoning)
        out.append(_thought(bounded(thinking, budget, tail=not answering)[0], answering, view.reasoning_s))
    if view.content:
        out.append({"role": "assistant", "content": bounded(view.content, budget, tail=True)[0]})
    if view.phase == "waiting":
        # in the gateway's fair queue with the API keys (docs/chat.md "Taking turns")
        out.append(_sub(f"waiting for the GPU ({view.queued_ahead} ahead)…" if view.queued_ahead is not None
                        else "waiting for the first token…"))
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


def endpoint_line(chat: ChatService, custom_url: str, gpus: int = 1) -> tuple[bool, str]:
    """`gpus`: the box's engines (docs/engine.md "Several GPUs"): the Chat tab talks to GPU 0's and says so."""
    ep = chat.endpoint(custom_url or None)
    sim = " · **SIMULATED**" if ep.simulated else ""
    profile = f" · profile `{ep.profile_id}`" if ep.profile_id else ""
    gpu = f" · answered by GPU 0 (of {gpus})" if gpus > 1 and not custom_url else ""
    where = f"`{ep.base_url}` · model `{ep.model}`{profile}{gpu}{sim}"
    if ep.ready:
        return True, f"**Engine ready**\n\n{where}"  # two paragraphs: a narrow window hides the second (panel.css)
    return False, f"**Chat is unavailable.** {ep.reason}\n\n{where}"


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
    full_md: gr.Checkbox  # "render long messages as Markdown": shown only when some message is plain text
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
    """The tab's components and per-page state, handed to the wiring functions.

    `shown` is what this page's Chatbot shows of the store (docs/chat.md#several-tabs): the
    conversation's revision and whether that view is final (no reply was streaming, or this page
    draws the reply itself). `list_shown` is the conversation list's revision."""

    conv_id: gr.State
    editing: gr.State
    ready_state: gr.State
    shown: gr.State
    list_shown: gr.State
    side: Sidebar
    thread: Thread
    tune: Tuning

    @property
    def conv_targets(self) -> list[gr.components.Component]:
        return [self.conv_id, self.side.convs, self.thread.bot, self.tune.system, self.editing, self.thread.edit_hint,
                self.thread.full_md, self.shown, self.list_shown]


def sampling_of(t: float, p: float, m: float, n: float | None) -> SamplingParams:
    """Max tokens under 1 means "not set" (the card's default), said beside the box (no Gradio bound: its refusal
    printed a traceback, issue 49)."""
    return SamplingParams(float(t), float(p), float(m), int(n) if n and n >= 1 else None)


def expected_revision(shown: Any) -> int | None:
    """The revision a page shows (its `shown` state), for a send that must be based on it."""
    return int(shown[0]) if isinstance(shown, (list, tuple)) and shown else None


def render(state: AppState, shell: Shell) -> None:
    chat = state.chat
    if chat is None:
        gr.Markdown("Chat is not available: this panel runs without a chat service.")
        return
    v = _layout(chat)
    _wire_conversations(chat, v)
    _wire_replies(chat, v)
    _wire_settings(chat, v, shell, len(state.box.gpus) if state.box is not None else 1)


def _layout(chat: ChatService) -> ChatView:
    conv_id = gr.State("")
    editing = gr.State(False)
    ready_state = gr.State(None)
    shown = gr.State(None)
    list_shown = gr.State(-1)
    # elem_ids: at a narrow width the CSS (assets/css/panel.css, "Chat tab") puts the thread above the
    # conversation list, so the input and the latest messages are on screen without scrolling past it.
    with gr.Row(equal_height=False, elem_id="chat-layout"):
        with gr.Column(scale=1, min_width=230, elem_id="chat-side"):
            side = _sidebar()
        with gr.Column(scale=4, elem_id="chat-main"):
            thread = _thread()
            tune = _tuning(chat)
    return ChatView(conv_id, editing, ready_state, shown, list_shown, side, thread, tune)


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
    with gr.Row(elem_id="chat-banner-row"):
        banner = gr.Markdown("", elem_id="chat-banner")
        engine_btn = gr.Button("Open Engine tab", size="sm", visible=False, scale=0, elem_id="chat-goto-engine")
    bot = gr.Chatbot(
        show_label=False, height=560, latex_delimiters=[], buttons=["copy"], feedback_options=None,
        elem_id="chat-bot",
        placeholder="Ask the model something. Its thinking appears collapsed above the answer.",
    )
    full_md = gr.Checkbox(False, label="Render long messages as Markdown (a very long or markup-heavy message can "
                          "take the browser minutes)", visible=False, elem_id="chat-render-md")
    with gr.Row():
        box = gr.Textbox(show_label=False, placeholder="Message (Enter to send, Shift+Enter for a new line)",
                         lines=1, max_lines=12, scale=6, elem_id="chat-input",  # lines=1: Enter sends
                         min_width=320)  # a 420 px window: the box gets its own line, Send + Stop the next
        send_btn = gr.Button("Send", variant="primary", scale=1, elem_id="chat-send")
        stop_btn = gr.Button("Stop", variant="stop", scale=1, elem_id="chat-stop")
    with gr.Row():
        regen_btn = gr.Button("Regenerate", size="sm", elem_id="chat-regen")
        edit_btn = gr.Button(EDIT_LABEL, size="sm", elem_id="chat-edit")  # "Cancel edit" while editing
        clear_btn = gr.Button("Clear conversation", size="sm", elem_id="chat-clear")
    edit_hint = gr.Markdown("", elem_id="chat-edit-hint")
    return Thread(banner, engine_btn, bot, full_md, box, send_btn, stop_btn, regen_btn, edit_btn, clear_btn, edit_hint)


def _tuning(chat: ChatService) -> Tuning:
    d = chat.default_sampling()
    with gr.Accordion("Sampling and system prompt", open=False, elem_id="chat-sampling"):
        gr.Markdown(f"Defaults from the model card: *{html.escape(chat.sampling_note)}*")
        with gr.Row():
            temp = gr.Slider(0, 2, value=d.temperature, step=0.05, label="temperature", elem_id="chat-temp")
            top_p = gr.Slider(0.01, 1, value=d.top_p, step=0.01, label="top_p", elem_id="chat-top-p")
            min_p = gr.Slider(0, 1, value=d.min_p, step=0.01, label="min_p", elem_id="chat-min-p")
            max_tokens = gr.Number(value=d.max_tokens, precision=0, label="max tokens",
                                   elem_id="chat-max-tokens")
        temp_warn = gr.Markdown("", elem_id="chat-temp-warning")
        system = gr.Textbox(label="System prompt (this conversation)", lines=2, elem_id="chat-system")
        custom_url = gr.Textbox(label="Endpoint override (blank = the panel's engine)",
                                placeholder="http://127.0.0.1:8000", elem_id="chat-endpoint")
    with gr.Accordion("API snippets (current endpoint and sampling)", open=False):
        curl_code = gr.Code(language="shell", label="curl", interactive=False, elem_id="chat-curl")
        py_code = gr.Code(language="python", label="Python (openai)", interactive=False, elem_id="chat-python")
    return Tuning(temp, top_p, min_p, max_tokens, temp_warn, system, custom_url, curl_code, py_code)


def _shown(chat: ChatService, cid: str) -> tuple[int, bool]:
    """What a page is about to show of `cid`: its revision, read before the messages are (a change in
    between only makes the next tick redraw), and whether no reply is streaming in it."""
    return chat.revision(cid), chat.active_turn(cid) is None


def _thread_outputs(chat: ChatService, cid: str, full: bool) -> tuple[Any, ...]:
    """(Chatbot messages, the Markdown choice, shown) for one conversation."""
    shown = _shown(chat, cid)
    view = history_view(chat.get(cid).messages, full)
    return view.messages, gr.Checkbox(value=full, visible=bool(view.plain) or full), shown


def _conv_outputs(chat: ChatService, conv: Conversation) -> tuple[Any, ...]:
    list_rev = chat.list_revision()
    messages, full_md, shown = _thread_outputs(chat, conv.id, False)
    return (conv.id, gr.Radio(choices=conversation_choices(chat), value=conv.id), messages, conv.system_prompt,
            False, "", full_md, shown, list_rev)


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
        return (cid, gr.Radio(choices=conversation_choices(chat), value=cid), shown, "", False, "",
                gr.Checkbox(value=False, visible=False), None, chat.list_revision())


# One click downloads (issue 29: Export took a second click on the file link): once the event has put
# the file in the (hidden-until-used) File component, this clicks its link. `f` is that component's value.
JS_DOWNLOAD = """(f) => {
  if (!f || !f.url) return;
  const a = document.createElement('a');
  a.href = f.url; a.download = f.orig_name || ''; a.style.display = 'none';
  document.body.appendChild(a); a.click(); a.remove();
}"""

# Send is disabled while the box holds only whitespace (issue 29: an empty Send raised an error toast);
# the server ignores an empty send as well, so a click that beats this script changes nothing.
JS_SEND_ENABLED = """(t) => requestAnimationFrame(() => {
  const b = document.querySelector('#chat-send'), ta = document.querySelector('#chat-input textarea');
  if (!b || !ta) return;
  b.disabled = !ta.value.trim() || ta.disabled;  // ta.disabled: the engine is not ready
  b.setAttribute('aria-disabled', String(b.disabled));
})"""


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

    def on_full_markdown(cid: str, full: bool) -> tuple[Any, ...]:
        if not cid:
            return gr.skip(), gr.skip(), gr.skip()
        return _thread_outputs(chat, cid, bool(full))

    confirm = gr.Checkbox(visible=False)
    v.side.convs.input(on_select, [v.side.convs], conv_targets, api_name="chat_select")
    v.side.new_btn.click(on_new, None, conv_targets, api_name="chat_new")
    v.side.rename_box.submit(on_rename, [v.conv_id, v.side.rename_box], [v.side.convs, v.side.rename_box], api_name="chat_rename")
    v.side.delete_btn.click(on_delete, [v.conv_id, confirm], conv_targets, api_name="chat_delete",
                            js="(c, x) => [c, confirm('Delete this conversation and its history?')]")
    v.thread.clear_btn.click(on_clear, [v.conv_id, confirm], conv_targets, api_name="chat_clear",
                             js="(c, x) => [c, confirm('Remove every message of this conversation?')]")
    v.tune.system.blur(on_system, [v.conv_id, v.tune.system], None)
    for btn, fmt in ((v.side.export_json_btn, "json"), (v.side.export_md_btn, "md")):
        btn.click(lambda c, f=fmt: on_export(c, f), [v.conv_id], [v.side.export_file], api_name=f"chat_export_{fmt}"
                  ).then(None, [v.side.export_file], None, js=JS_DOWNLOAD)
    v.side.import_btn.upload(on_import, [v.side.import_btn], conv_targets, api_name="chat_import")
    v.thread.full_md.input(on_full_markdown, [v.conv_id, v.thread.full_md],
                           [v.thread.bot, v.thread.full_md, v.shown], api_name="chat_full_markdown")


def _wire_replies(chat: ChatService, v: ChatView) -> None:
    sampling_inputs = v.tune.sampling_inputs
    # ---- sending and streaming ------------------------------------------------------------------
    def stream_turn(cid: str, turn: Any, full: bool) -> Iterator[list[dict[str, Any]]]:
        """Chatbot values for a streaming reply; closing this generator (Stop) stops the reply."""
        prefix = render_history(chat.get(cid).messages[:-1], full)  # rendered once; the reply is the last message
        try:
            for view in turn.follow(interval_fn=lambda v: update_interval(on_screen_chars(v))):
                yield prefix + render_live(view, full)
        finally:
            if not turn.done.is_set():  # Stop pressed, conversation switched or page closed
                turn.stop(timeout=0)

    def moved(cid: str, exc: ChatError, full: bool) -> tuple[Any, ...]:
        """A send refused because the conversation moved on: show its turns now, keep the text."""
        gr.Warning(str(exc))
        messages, full_md, shown = _thread_outputs(chat, cid, full)
        return messages, full_md, shown, f"**Not sent — {html.escape(str(exc))}**"

    def on_send(cid: str, text: str | None, is_edit: bool, sys_prompt: str | None, url: str, t: float, p: float,
                m: float, n: float | None, shown: Any, full: bool):
        # One event does send + stream: a second chained event would add a queue round trip to TTFT.
        skip = gr.skip()
        if not (text or "").strip():  # an empty Send does nothing (Send is disabled in the page too)
            yield skip, skip, skip, skip, skip, skip, skip
            return
        sampling = sampling_of(t, p, m, n)
        try:  # retitle: the first message names the conversation
            turn, retitle = chat.send_composed(cid, text or "", sampling, edit=bool(is_edit),
                                               system_prompt=sys_prompt or "", custom_url=url or None,
                                               expected_revision=expected_revision(shown))
        except ConversationMoved as exc:
            messages, full_md, now_shown, hint = moved(cid, exc, bool(full))
            yield skip, messages, skip, hint, gr.Radio(choices=conversation_choices(chat), value=cid), now_shown, full_md
            return
        except ChatError as exc:
            raise gr.Error(str(exc)) from None
        # This page draws the reply to its end: its view is final once the stream is (the timer leaves it).
        mine = (chat.revision(cid), True)
        value: Any = skip
        for i, value in enumerate(stream_turn(cid, turn, bool(full))):
            if i == 0:  # first frame: only what must change now (the conversation list can wait a frame)
                yield "", value, (False if is_edit else skip), "", skip, mine, skip
            elif retitle:
                retitle = False
                yield skip, value, skip, skip, gr.Radio(choices=conversation_choices(chat), value=cid), skip, skip
            else:
                yield skip, value, skip, skip, skip, skip, skip
        if retitle:  # the reply ended within its first frame
            yield skip, skip, skip, skip, gr.Radio(choices=conversation_choices(chat), value=cid), skip, skip

    def on_regen(cid: str, url: str, t: float, p: float, m: float, n: float | None, shown: Any, full: bool):
        try:
            turn = chat.regenerate(cid, sampling_of(t, p, m, n), custom_url=url or None,
                                   expected_revision=expected_revision(shown))
        except ConversationMoved as exc:
            messages, full_md, now_shown, hint = moved(cid, exc, bool(full))
            yield messages, now_shown, full_md, hint
            return
        except ChatError as exc:
            raise gr.Error(str(exc)) from None
        mine = (chat.revision(cid), True)
        for i, value in enumerate(stream_turn(cid, turn, bool(full))):
            yield value, (mine if i == 0 else gr.skip()), gr.skip(), ("" if i == 0 else gr.skip())

    def on_stop(cid: str, full: bool) -> tuple[Any, ...]:
        # waits for the reply to be final (its "Stopped" mark stored): the stream's own event is cancelled with this
        # click, so this answer is the page's last view of it; a loaded box once took past 5 s to end the reader and
        # the page kept "answering" without the mark (concurrency_limit=None: this wait blocks no one)
        chat.stop(cid, timeout=STOP_WAIT_S)
        messages, _, shown = _thread_outputs(chat, cid, bool(full))
        return messages, shown

    send_inputs = [v.conv_id, v.thread.box, v.editing, v.tune.system, v.tune.custom_url, *sampling_inputs,
                   v.shown, v.thread.full_md]
    send_outputs = [v.thread.box, v.thread.bot, v.editing, v.thread.edit_hint, v.side.convs, v.shown,
                    v.thread.full_md]
    stream_kw = StreamEvent(concurrency_id=STREAM_CONCURRENCY, concurrency_limit=chat.max_streams,
                            show_progress="hidden")
    streams: list[dict[str, Any]] = [  # Gradio's `cancels` is typed as dicts; a Dependency is one
        v.thread.box.submit(on_send, send_inputs, send_outputs, api_name="chat_send", **stream_kw),
        v.thread.send_btn.click(on_send, send_inputs, send_outputs, api_visibility="private", **stream_kw),
        v.thread.regen_btn.click(on_regen, [v.conv_id, v.tune.custom_url, *sampling_inputs, v.shown, v.thread.full_md],
                                 [v.thread.bot, v.shown, v.thread.full_md, v.thread.edit_hint],
                                 api_name="chat_regenerate", **stream_kw),
    ]
    v.thread.stop_btn.click(on_stop, [v.conv_id, v.thread.full_md], [v.thread.bot, v.shown], cancels=streams,
                            api_name="chat_stop", concurrency_limit=None, show_progress="hidden")
    # Leaving the conversation ends its live view (and, through `finally`, the reply).
    for trigger in (v.side.convs.input, v.side.new_btn.click):
        trigger(None, None, None, cancels=streams, queue=False)
    # Send follows the box: disabled while it holds only whitespace (a browser-side check, no round trip).
    v.thread.box.change(None, [v.thread.box], None, js=JS_SEND_ENABLED)

    def on_edit(cid: str, is_edit: bool, shown: Any, full: bool) -> tuple[Any, ...]:
        skip = gr.skip()
        if is_edit:  # second click cancels editing
            return "", False, "", skip, skip, skip
        try:
            chat.check_revision(cid, expected_revision(shown))
        except ConversationMoved as exc:
            messages, full_md, now_shown, hint = moved(cid, exc, bool(full))
            return skip, False, hint, messages, now_shown, full_md
        text = chat.last_user_text(cid)
        if not text:
            raise gr.Error("There is no message to edit yet.")
        return (text, True, "**Editing your last message** — **Send** replaces it and regenerates the answer; "
                "**Cancel edit** keeps it as it was.", skip, skip, skip)

    v.thread.edit_btn.click(on_edit, [v.conv_id, v.editing, v.shown, v.thread.full_md],
                            [v.thread.box, v.editing, v.thread.edit_hint, v.thread.bot, v.shown, v.thread.full_md],
                            api_name="chat_edit")
    # the one button says what a click does now (issue 49: Edit had no visible cancel); an edit ends by Send,
    # by this cancel, or by opening another conversation, each of which sets `editing` back
    v.editing.change(lambda e: gr.Button(value=CANCEL_EDIT_LABEL if e else EDIT_LABEL), [v.editing],
                     [v.thread.edit_btn], show_progress="hidden", api_visibility="private")


def _wire_settings(chat: ChatService, v: ChatView, shell: Shell, gpus: int = 1) -> None:
    root = Context.root_block
    sampling_inputs = v.tune.sampling_inputs
    # ---- sampling warning, snippets, readiness --------------------------------------------------
    def on_sampling(t: float, p: float, m: float, n: float | None, sys_prompt: str, url: str) -> tuple[str, str, str]:
        sampling, sys_prompt = sampling_of(t, p, m, n), sys_prompt or ""
        warns = chat.sampling_warnings(sampling)
        if n is not None and n < 1:
            warns.append(f"max tokens {n:g} is not a length: the default ({chat.default_sampling().max_tokens}) is sent")
        warn = "".join(f"**Warning — {html.escape(w)}**\n" for w in warns)
        curl, py = chat.snippets(sampling, sys_prompt, custom_url=url or None)
        return warn, curl, py

    sampling_args = [*sampling_inputs, v.tune.system, v.tune.custom_url]
    snippet_outputs = [v.tune.temp_warn, v.tune.curl_code, v.tune.py_code]
    for comp in (*sampling_inputs, v.tune.system, v.tune.custom_url):
        comp.change(on_sampling, sampling_args, snippet_outputs, show_progress="hidden", trigger_mode="always_last",
                    api_visibility="private")
    if root is not None:
        root.load(on_sampling, sampling_args, snippet_outputs, api_visibility="private")

    t = v.thread
    ready_outputs = [t.banner, t.engine_btn, t.box, t.send_btn, t.regen_btn, v.ready_state]
    sync_outputs = [t.bot, t.full_md, v.shown, v.side.convs, v.list_shown]

    def ready_part(url: str, last: Any) -> tuple[Any, ...]:
        ready, line = endpoint_line(chat, url, gpus)
        if last == (ready, line):  # nothing changed: send nothing (this runs every second per open page)
            return (*(gr.skip() for _ in ready_outputs[:-1]), last)
        return (line, gr.Button(visible=not ready), gr.Textbox(interactive=ready), gr.Button(interactive=ready),
                gr.Button(interactive=ready), (ready, line))

    def sync_part(cid: str, shown: Any, list_shown: int, full: bool) -> tuple[Any, ...]:
        """Follow the store (docs/chat.md#several-tabs): redraw the open conversation when another tab
        or window changed it, once no reply streams in it; refresh the list when it changed."""
        skip = gr.skip()
        out: list[Any] = [skip] * len(sync_outputs)
        if not cid or shown is None:  # the page has not loaded its conversation yet
            return tuple(out)
        list_rev = chat.list_revision()
        if list_rev != list_shown:
            ids = [s.id for s in chat.list_conversations()]
            out[3:] = [gr.Radio(choices=conversation_choices(chat), value=cid if cid in ids else None), list_rev]
            if cid not in ids:  # deleted in another tab: say so (a send would fail: it does not exist)
                out[:3] = [[_sub("This conversation was deleted in another tab or window. Pick another one or "
                                 "start a New chat.")], gr.Checkbox(value=False, visible=False), None]
                return tuple(out)
        if chat.active_turn(cid) is None and tuple(shown) != (chat.revision(cid), True):
            try:
                out[:3] = _thread_outputs(chat, cid, bool(full))
            except ChatError:
                pass
        return tuple(out)

    def on_tick(url: str, last: Any, cid: str, shown: Any, list_shown: int, full: bool) -> tuple[Any, ...]:
        return (*ready_part(url, last), *sync_part(cid, shown, list_shown, full))

    tick_inputs = [v.tune.custom_url, v.ready_state, v.conv_id, v.shown, v.list_shown, t.full_md]
    shell.version(lambda: (endpoint_line(chat, ""), shell.engine_now()[0], chat.list_revision(),
                           sorted(chat.answering())))
    shell.timer.tick(on_tick, tick_inputs, ready_outputs + sync_outputs, concurrency_id="chat-ready",
                     concurrency_limit=None, show_progress="hidden", api_visibility="private")
    # The endpoint changed (engine started, profile switched): so do the snippets; and Send follows the
    # box again (the tick just set its interactivity from readiness alone).
    v.ready_state.change(on_sampling, sampling_args, snippet_outputs, show_progress="hidden", api_visibility="private")
    v.ready_state.change(None, [t.box], None, js=JS_SEND_ENABLED)
    if root is not None:
        root.load(ready_part, [v.tune.custom_url, v.ready_state], ready_outputs, api_visibility="private")
    v.thread.engine_btn.click(lambda: gr.Tabs(selected="engine"), None, shell.tabs, api_visibility="private")
