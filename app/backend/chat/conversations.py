"""ChatService: conversations, streamed replies and their stats, for the UI, the CLI and benches.

`state.chat` in the panel. Thread-safe; one reply streams per conversation at a time. In the panel it
follows the engine's change events (`engine=`: one watch, closed with the service; docs/engine.md, "Who
listens"): whether it can talk to the engine now, and why not, comes from the snapshot the events keep.
"""

from __future__ import annotations

import dataclasses
import re
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import app.backend.chat.export as export
from app.backend.chat.client import ChatRequest, ChatStream, SamplingParams
from app.backend.chat.endpoint import ENGINE_TAB_HINT, Endpoint, HealthProbe, resolve_endpoint
from app.backend.chat.events import StreamError
from app.backend.chat.models import (
    DEFAULT_TITLE, Conversation, ConversationSummary, Message, MessageStats, title_from_prompt,
)
from app.backend.chat.snippets import curl_snippet, python_snippet
from app.backend.chat.stats import StatsRecorder
from app.backend.chat.store import ChatStore, ChatStoreError
from app.backend.contracts import CHAT_MAX_TOKENS, ChatGate, ChatRoute, EngineEvents, EngineSnapshot, SnapshotFn
from app.backend.chat.turn import Turn
from app.backend.engine.runtime.client import EngineClient, engine_client
from app.backend.web.exports import write_export
from app.backend.recipe.schema import Recipe

DB_NAME = "chat.sqlite"
DEFAULT_MAX_TOKENS = CHAT_MAX_TOKENS
DIAGNOSIS_WAIT_S = 2.0  # after a broken stream, how long to wait for the controller to classify it
MAX_STREAMS = 8  # replies streaming at once, over all conversations (the page's queue)
# One message or system prompt, UTF-8 encoded (docs/chat.md#limits): far above any prompt a person
# types or pastes, far below what would bloat chat.sqlite and the page (issue 13: a 50 MB send).
MAX_MESSAGE_BYTES = 256 * 1024


class ChatError(RuntimeError):
    """A chat action cannot be done now; the message says why and what to do."""


class ConversationMoved(ChatError):
    """The conversation changed (another tab or window) since the page that asked last showed it."""

    def __init__(self) -> None:
        super().__init__("This conversation changed in another tab or window since this page showed it. Its "
                         "new turns are shown now; your message was not sent and is still in the box: send it again.")


def check_size(text: str, what: str) -> None:
    """Refuse a message or system prompt over MAX_MESSAGE_BYTES (every send path calls this)."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_MESSAGE_BYTES:
        raise ChatError(f"{what} is {size / 1024:.0f} KiB; the limit is {MAX_MESSAGE_BYTES // 1024} KiB. "
                        "Shorten it, or send a long document in parts.")


def export_name(conv: Conversation, fmt: str) -> str:
    """A file name for an export: the whole title in safe characters (`[A-Za-z0-9._-]`, as
    app.backend.web.exports.safe_name) and the id's first 8 characters."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", conv.title).strip("-.") or "chat"  # titles are ≤ 120 characters
    return f"{slug}-{conv.id[:8]}.{'json' if fmt == 'json' else 'md'}"


class ChatService:
    def __init__(
        self,
        recipe: Recipe,
        state_dir: Path,
        snapshot_fn: SnapshotFn | None = None,  # a fixed source (CLI, benches); `engine` wins when given
        checkpoint_s: float = 2.0,
        extra_body: dict[str, object] | None = None,  # added to every request (benchmarks: {"ignore_eos": True})
        max_streams: int = MAX_STREAMS,
        engine: EngineEvents | None = None,  # the controller: followed through its change events
    ):
        self.recipe = recipe
        self.max_streams = max_streams
        self._extra_body = dict(extra_body or {})
        self._watch = engine.watch() if engine is not None else None
        self._snapshot_fn: SnapshotFn | None = self._watched if self._watch is not None else snapshot_fn
        self._store = ChatStore(Path(state_dir) / DB_NAME)
        self._probe = HealthProbe()
        self._checkpoint_s = checkpoint_s
        self._lock = threading.RLock()
        self._convs: dict[str, Conversation] = {}
        self._turns: dict[str, Turn] = {}
        self._state_dir = Path(state_dir)
        self._exported: set[Path] = set()  # export files this service wrote: removed at close
        # Revisions (docs/chat.md#several-tabs): a conversation's bumps when its messages change (a turn
        # starts, clear, edit, regenerate); the list's when any conversation is added, removed, renamed
        # or reordered. Pages compare them on their 1 s timer and re-read the store when they moved.
        self._revs: dict[str, int] = {}
        self._list_rev = 0
        # the panel's gateway (docs/chat.md "Taking turns"): while it serves, replies take their turn in its fair
        # queue with the API keys, under the panel's own key; set by the panel's wiring (state.py)
        self._gate: ChatGate | None = None
        self._gate_client: tuple[ChatRoute, EngineClient] | None = None

    def take_turns_through(self, gate: ChatGate) -> None:
        """Send replies through the panel's gateway whenever it serves (its admission and fair queue, its usage and
        /metrics); while it is off, straight to the engine as before."""
        self._gate = gate

    # ---- endpoint and sampling ----------------------------------------------------------------
    def _watched(self) -> EngineSnapshot | None:
        return self._watch.snapshot if self._watch is not None else None

    @property
    def engine_seq(self) -> int:
        """The seq of the last engine change the service has seen (0 without events): a page that keeps it
        knows whether `endpoint()` can have changed since (a custom URL's probe aside)."""
        return self._watch.seq if self._watch is not None else 0

    def endpoint(self, custom_url: str | None = None) -> Endpoint:
        # the state dir is <data dir>/.moet-panel (settings.Settings.state_dir), where the engine's socket lives
        return resolve_endpoint(self.recipe, self._state_dir.parent, self._snapshot_fn, self._probe, custom_url)

    def default_sampling(self) -> SamplingParams:
        s = self.recipe.sampling
        # never above the context: vLLM refuses max_tokens > max_model_len with a 400 (docs/real-engine.md)
        return SamplingParams(s.temperature, s.top_p, s.min_p,
                              min(DEFAULT_MAX_TOKENS, self.recipe.context.validated_max_tokens))

    @property
    def sampling_note(self) -> str:
        return self.recipe.sampling.note

    def sampling_warnings(self, sampling: SamplingParams) -> list[str]:
        warnings = []
        if sampling.temperature <= 0:
            warnings.append(f"Temperature 0: {self.recipe.sampling.never_zero_note}")
        return warnings

    def snippets(self, sampling: SamplingParams, system_prompt: str = "", custom_url: str | None = None,
                 prompt: str = "Hello!") -> tuple[str, str]:
        ep = self.endpoint(custom_url)
        return (curl_snippet(ep.base_url, ep.model, sampling, system_prompt, prompt),
                python_snippet(ep.base_url, ep.model, sampling, system_prompt, prompt))

    # ---- conversations ------------------------------------------------------------------------
    def list_conversations(self) -> list[ConversationSummary]:
        return self._store.list()

    def revision(self, conv_id: str) -> int:
        """Bumps whenever the conversation's messages change; a page sends with the one it shows."""
        with self._lock:
            return self._revs.get(conv_id, 0)

    def list_revision(self) -> int:
        with self._lock:
            return self._list_rev

    def _bump(self, conv_id: str | None, messages: bool = True) -> None:
        with self._lock:
            if conv_id is not None and messages:
                self._revs[conv_id] = self._revs.get(conv_id, 0) + 1
            self._list_rev += 1

    def check_revision(self, conv_id: str, expected: int | None) -> None:
        """Raise ConversationMoved when the page's view (`expected`) is not the conversation's now."""
        if expected is not None and expected != self.revision(conv_id):
            raise ConversationMoved()

    def new_conversation(self, title: str = DEFAULT_TITLE, system_prompt: str = "") -> Conversation:
        conv = Conversation(title=title.strip() or DEFAULT_TITLE, system_prompt=system_prompt)
        self._store.create(conv)
        with self._lock:
            self._convs[conv.id] = conv
        self._bump(conv.id, messages=False)
        return conv

    def get(self, conv_id: str) -> Conversation:
        with self._lock:
            conv = self._convs.get(conv_id)
            if conv is None:
                conv = self._store.load(conv_id)
                if conv is None:
                    raise ChatError(f"conversation {conv_id} does not exist (deleted in another tab?)")
                self._convs[conv_id] = conv
            return conv

    def rename(self, conv_id: str, title: str) -> Conversation:
        conv = self.get(conv_id)
        conv.title = " ".join(title.split())[:120] or DEFAULT_TITLE
        self._store.update_conversation(conv)
        self._bump(conv_id, messages=False)
        return conv

    def set_system_prompt(self, conv_id: str, system_prompt: str) -> None:
        check_size(system_prompt, "The system prompt")
        conv = self.get(conv_id)
        if conv.system_prompt != system_prompt:
            conv.system_prompt = system_prompt
            self._store.update_conversation(conv)

    def delete(self, conv_id: str) -> None:
        self.stop(conv_id)
        self._store.delete(conv_id)
        with self._lock:
            self._convs.pop(conv_id, None)
        self._bump(conv_id)

    def clear(self, conv_id: str) -> Conversation:
        """Remove every message, keep the conversation (title, system prompt)."""
        self.stop(conv_id)
        conv = self.get(conv_id)
        self._store.delete_messages([m.id for m in conv.messages if m.id is not None])
        conv.messages.clear()
        self._store.update_conversation(conv)
        self._bump(conv_id)
        return conv

    # ---- replies ------------------------------------------------------------------------------
    def answers_in_flight(self) -> int:
        """Replies streaming now (contracts.AnswerCounter): a stop or switch of the engine waits for them to
        finish, up to its drain grace (docs/engine.md "Keeps serving")."""
        with self._lock:
            return sum(1 for t in self._turns.values() if not t.done.is_set())

    def answering(self) -> frozenset[str]:
        """The conversations with a reply streaming now (the page feed's chat version: a page redraws a
        conversation another page answered in once that answer has ended)."""
        with self._lock:
            return frozenset(cid for cid, turn in self._turns.items() if not turn.done.is_set())

    def active_turn(self, conv_id: str) -> Turn | None:
        with self._lock:
            turn = self._turns.get(conv_id)
        return turn if turn is not None and not turn.done.is_set() else None

    def send(self, conv_id: str, text: str, sampling: SamplingParams, custom_url: str | None = None,
             extra_body: dict[str, object] | None = None) -> Turn:
        text = text.strip()
        if not text:
            raise ChatError("Type a message first.")
        check_size(text, "The message")
        conv, ep = self._prepare(conv_id, custom_url)
        user = Message(role="user", content=text)
        conv.messages.append(user)

        def persist() -> None:
            self._store.add_message(conv, user)
            if conv.title == DEFAULT_TITLE:
                conv.title = title_from_prompt(text)
                self._store.update_conversation(conv)

        return self._start_reply(conv, ep, sampling, extra_body, persist, unsaved=[user])

    def send_composed(self, conv_id: str, text: str, sampling: SamplingParams, *, edit: bool = False,
                      system_prompt: str = "", custom_url: str | None = None,
                      expected_revision: int | None = None) -> tuple[Turn, bool]:
        """What the chat page's Send does: save the system prompt, then send (or replace the last
        message when editing). Returns the turn and whether this was the conversation's first
        message (its title changes). `expected_revision`: the revision the page shows; a send from a
        page that has not seen the conversation's latest turns is refused (ConversationMoved)."""
        check_size(text, "The message")  # before the system prompt is saved: a refused Send changes nothing
        self.check_revision(conv_id, expected_revision)
        self.set_system_prompt(conv_id, system_prompt)
        first = self.get(conv_id).messages == []
        send = self.edit_last if edit else self.send
        return send(conv_id, text, sampling, custom_url=custom_url), first

    def regenerate(self, conv_id: str, sampling: SamplingParams, custom_url: str | None = None,
                   extra_body: dict[str, object] | None = None, expected_revision: int | None = None) -> Turn:
        """Drop the last reply and ask again with the same history."""
        self.check_revision(conv_id, expected_revision)
        conv, ep = self._prepare(conv_id, custom_url)
        if not any(m.role == "user" for m in conv.messages):
            raise ChatError("Nothing to regenerate yet: send a message first.")
        self._truncate_after_last_user(conv)
        # A regeneration is a new sample: a fresh seed (unless the caller fixed one) makes it one on an engine
        # that answers a seedless request the same way each time — the SIMULATED engine does (issue 42:
        # Regenerate in demo mode gave the identical text). For vLLM a random seed is what no seed means.
        body = {"seed": secrets.randbelow(2**31), **(extra_body or {})}
        return self._start_reply(conv, ep, sampling, body)

    def edit_last(self, conv_id: str, text: str, sampling: SamplingParams, custom_url: str | None = None,
                  extra_body: dict[str, object] | None = None) -> Turn:
        """Replace the last user message, drop what followed it, and resend."""
        text = text.strip()
        if not text:
            raise ChatError("The edited message is empty.")
        check_size(text, "The edited message")
        conv, ep = self._prepare(conv_id, custom_url)
        last_user = self._truncate_after_last_user(conv)
        if last_user is None:
            raise ChatError("There is no message to edit yet.")
        last_user.content = text
        return self._start_reply(conv, ep, sampling, extra_body, lambda: self._store.update_message(last_user))

    def last_user_text(self, conv_id: str) -> str:
        conv = self.get(conv_id)
        return next((m.content for m in reversed(conv.messages) if m.role == "user"), "")

    def stop(self, conv_id: str, timeout: float = 5.0) -> Message | None:
        """Stop the streaming reply (if any); returns it, final, with the partial text kept."""
        turn = self.active_turn(conv_id)
        if turn is None:
            return None
        turn.stop(timeout)
        return turn.message

    def _prepare(self, conv_id: str, custom_url: str | None) -> tuple[Conversation, Endpoint]:
        if self.active_turn(conv_id) is not None:
            raise ChatError("A reply is still streaming in this conversation: wait for it or press Stop.")
        conv = self.get(conv_id)
        snap = self._snapshot_fn() if self._snapshot_fn is not None and custom_url is None else None
        if snap is not None and snap.draining:  # a stop/switch waits for the answers in flight: none starts now
            raise ChatError(f"The engine is about to stop or switch: it is waiting for {snap.drain_in_flight} "
                            f"answer(s) to finish (up to {max(0, round(snap.drain_deadline - time.time()))} s). "
                            "Send again when it is back.")
        ep = self.endpoint(custom_url)
        if not ep.ready:
            raise ChatError(ep.reason or f"The engine is not ready. {ENGINE_TAB_HINT}")
        return conv, ep

    def _truncate_after_last_user(self, conv: Conversation) -> Message | None:
        idx = max((i for i, m in enumerate(conv.messages) if m.role == "user"), default=None)
        if idx is None:
            return None
        dropped = conv.messages[idx + 1 :]
        self._store.delete_messages([m.id for m in dropped if m.id is not None])
        del conv.messages[idx + 1 :]
        return conv.messages[idx]

    def _start_reply(self, conv: Conversation, ep: Endpoint, sampling: SamplingParams,
                     extra_body: dict[str, object] | None, persist_first: Callable[[], None] | None = None,
                     unsaved: list[Message] | None = None) -> Turn:
        """Send the request first, then write history while the engine prefills (TTFT is not spent
        on SQLite). The turn's writes wait until the rows exist."""
        history = [{"role": "system", "content": conv.system_prompt}] if conv.system_prompt.strip() else []
        # Prior reasoning is not sent back: as ordinary assistant text it would change the prompt.
        history += [{"role": m.role, "content": m.content} for m in conv.messages
                    if m.role in ("user", "assistant") and m.content]
        base = MessageStats(profile_id=ep.profile_id, simulated=ep.simulated, model=ep.model, build=ep.build,
                            base_url=ep.base_url, sampling=dataclasses.asdict(sampling))
        reply = Message(role="assistant", content="", status="streaming", stats=base)
        conv.messages.append(reply)
        body = {**self._extra_body, **(extra_body or {})}
        client, queue_fn = self._client_for(ep)
        stream = ChatStream(client, ChatRequest(ep.model, history, sampling, body))
        stored = threading.Event()
        turn = Turn(stream, reply, StatsRecorder(started=time.monotonic()),
                    on_checkpoint=lambda m: self._store.update_message(m) if stored.is_set() else None,
                    on_done=lambda t: self._turn_done(t, stored),
                    diagnose=lambda err: self._diagnose(err, ep), checkpoint_s=self._checkpoint_s, queue_fn=queue_fn)
        with self._lock:
            self._turns[conv.id] = turn
        self._bump(conv.id)
        turn.start()
        try:
            if persist_first is not None:
                persist_first()
            self._store.add_message(conv, reply)
        except ChatStoreError as exc:
            stored.set()
            turn.stop(timeout=5.0)
            for msg in [*(unsaved or []), reply]:
                if msg.id is None and msg in conv.messages:
                    conv.messages.remove(msg)
            raise ChatError(f"The message was not sent: {exc}") from exc
        finally:
            stored.set()
        return turn

    def _client_for(self, ep: Endpoint) -> tuple[EngineClient, Callable[[], int | None] | None]:
        """The panel's engine, through the gateway while it serves (its fair queue decides when this reply gets
        the GPU; the second item tells the reply's place while it waits); a URL the user typed, or the gateway
        off: directly."""
        gate = self._gate
        route = gate.chat_route() if gate is not None and ep.source == "engine" else None
        if gate is None or route is None:
            return engine_client(ep.base_url), None
        with self._lock:
            kept = self._gate_client
            if kept is None or kept[0] != route:
                if kept is not None:
                    kept[1].close()
                kept = self._gate_client = (route, EngineClient(route.url, route.key, verify=route.verify))
        key = route.key
        return kept[1], lambda: gate.waiting_ahead(key)

    def _turn_done(self, turn: Turn, stored: threading.Event) -> None:
        stored.wait(30.0)
        if turn.message.id is None:
            return
        try:
            self._store.update_message(turn.message)
        except ChatStoreError as exc:  # keep the reply on screen and say it is not in the history
            msg = turn.message
            msg.error = f"{msg.error} History not saved: {exc}".strip()

    def _diagnose(self, err: StreamError, ep: Endpoint) -> str:
        """The error text kept on a failed reply: what broke, plus the controller's diagnosis."""
        text = err.message[:1].upper() + err.message[1:] + "."
        snapshot_fn = self._snapshot_fn
        snap = snapshot_fn() if snapshot_fn is not None else None
        if ep.source != "engine" or snapshot_fn is None or snap is None:
            return f"{text} Check the engine (`moet-panel engine status`)."
        deadline = time.monotonic() + DIAGNOSIS_WAIT_S
        watch = self._watch
        seq = watch.seq if watch is not None else 0
        while snap.diagnosis is None and snap.is_ready and time.monotonic() < deadline:
            # the controller notices a dead engine within its own poll interval: wake on its next change event
            if watch is not None:
                if watch.closed:  # the service is closing: no more events will come
                    break
                seq, snap = watch.wait(seq, deadline - time.monotonic())
            else:  # a fixed source has no events: look again shortly
                time.sleep(0.1)
                snap = snapshot_fn() or snap
        if snap.diagnosis is not None:
            d = snap.diagnosis
            return f"{text} Diagnosis: {d.title} — {d.explanation} Fix: {d.fix}"
        if not snap.is_ready:
            return f"{text} The engine is now {snap.state.value}{f' ({snap.message})' if snap.message else ''}. {ENGINE_TAB_HINT}"
        return text

    # ---- export / import ----------------------------------------------------------------------
    def export_json(self, conv_id: str) -> str:
        return export.to_json(self.get(conv_id))

    def export_markdown(self, conv_id: str) -> str:
        return export.to_markdown(self.get(conv_id))

    def export_file(self, conv_id: str, fmt: str) -> Path:
        """Write an export (for a browser download) and return its path. The file is named after the
        whole title (issue 29: it was cut to 40 characters) plus the id's start, so two chats with
        one title do not overwrite each other."""
        conv = self.get(conv_id)
        text = export.to_json(conv) if fmt == "json" else export.to_markdown(conv)
        path = write_export(self._state_dir, export_name(conv, fmt), text)
        with self._lock:
            self._exported.add(path)
        return path

    def import_json(self, text: str) -> Conversation:
        conv = export.from_json(text)
        if self._store.load(conv.id) is not None:
            conv.id = uuid.uuid4().hex
        for msg in conv.messages:
            msg.id = None
            if msg.status == "streaming":
                msg.status = "stopped"
        self._store.create(conv)
        with self._lock:
            self._convs[conv.id] = conv
        self._bump(conv.id)
        return conv

    def import_file(self, path: str | Path) -> Conversation:
        """Import a JSON export (e.g. an uploaded file); errors name the problem."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ChatError(f"cannot read {Path(path).name}: {exc}") from exc
        try:
            return self.import_json(text)
        except export.ChatImportError as exc:
            raise ChatError(f"{Path(path).name}: {exc}") from exc

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()  # unsubscribe; endpoint() keeps the last snapshot it saw
        with self._lock:
            turns = list(self._turns.values())
        for turn in turns:
            if not turn.done.is_set():
                turn.stop(2.0)
        self._store.close()
        with self._lock:
            kept, self._gate_client = self._gate_client, None
        if kept is not None:
            kept[1].close()
        with self._lock:  # the export files were handed to the browser already (issue 30: none left behind)
            exported, self._exported = self._exported, set()
        for path in exported:
            path.unlink(missing_ok=True)
