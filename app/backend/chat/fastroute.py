"""HTTP side of the chat's quick start: `POST <root>/moet-panel/chat/send` → `text/event-stream`.

Gradio's own path from a click to the first token on screen costs tens of milliseconds (two round
trips to join its queue and open its stream, its scheduler, diffing, a full Chatbot render — see
docs/chat.md). The page's script posts the Send here instead, the moment it is clicked; this route
starts the reply (`ChatService.send_composed`, one engine request) and streams what arrives until
the page's Gradio event has claimed the turn and drawn it (fastpath.py).

Body: the Send's fields as JSON (`PageSend.from_json`). Answer: SSE, one JSON object per `data:`:
    {"ev": "started"}                           the engine has the request
    {"ev": "text", "r": "…", "c": "…"}          thinking / answer text that arrived since the last event
    {"ev": "text", "reset": true, "r", "c"}     the whole text again (a `</think>` reclassified it)
    {"ev": "claimed"}                           the page's Gradio event has taken the reply over
    {"ev": "done", "status": "complete|stopped|error"}
Refusals are JSON `{"error": …}`: 400 bad body, 403 another origin, 409 the chat said no (why) or
`max_streams` replies are already streaming (the page then sends through Gradio's event, which waits
in its queue under the same limit), 415 not JSON. Closing the stream stops the reply only if the
page's Gradio event has not claimed it within a few seconds (the page went away); otherwise Stop
does. Authentication is the caller's (`dependencies` of the mounted route: the panel passes
Gradio's own login check).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlsplit

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from app.backend.chat.fastpath import PageSend, TicketBook, TicketError
from app.backend.chat.service import ChatError, ChatService
from app.backend.chat.turn import Turn

SEND_PATH = "/moet-panel/chat/send"


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def same_origin(request: Request) -> bool:
    """A browser names the page that made a request in `Origin`; only the panel's own page may post
    here (cross-site request forgery). Requests without `Origin` are not from another site's page."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    hosts = {request.headers.get("host"), request.headers.get("x-forwarded-host")} - {None}
    return urlsplit(origin).netloc in hosts


async def follow_events(turn: Turn, ticket: str, book: TicketBook) -> AsyncIterator[str]:
    """The SSE events of one started reply: deltas as they arrive, without a thread per follower."""
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def poke() -> None:  # called from the turn's reader thread
        loop.call_soon_threadsafe(wake.set)

    unsubscribe = turn.subscribe(poke)
    book.subscribe_claim(ticket, poke)
    sent_r = sent_c = 0
    claimed = False
    try:
        yield _sse({"ev": "started"})
        while True:
            await wake.wait()
            wake.clear()
            view = turn.view()
            if len(view.reasoning) < sent_r or len(view.content) < sent_c:
                yield _sse({"ev": "text", "reset": True, "r": view.reasoning, "c": view.content})
            elif len(view.reasoning) > sent_r or len(view.content) > sent_c:
                yield _sse({"ev": "text", "r": view.reasoning[sent_r:], "c": view.content[sent_c:]})
            sent_r, sent_c = len(view.reasoning), len(view.content)
            if not claimed and book.is_claimed(ticket):
                claimed = True
                yield _sse({"ev": "claimed"})
            if view.done:
                yield _sse({"ev": "done", "status": view.message.status})
                return
    finally:
        unsubscribe()
        if not book.is_claimed(ticket):  # the page left before its Gradio event took the reply
            book.release(ticket)


def send_endpoint(chat: ChatService, book: TicketBook) -> Callable[[Request], Awaitable[Response]]:
    """The route's handler, to be mounted with the panel's authentication."""

    def start(send: PageSend) -> Turn:
        return book.start(send, lambda s: chat.send_composed(
            s.conv_id, s.text, s.sampling, edit=s.edit, system_prompt=s.system_prompt,
            custom_url=s.custom_url or None, defer_history=True))

    async def send(request: Request) -> Response:
        if not same_origin(request):
            return JSONResponse({"error": "requests from another site are refused"}, status_code=403)
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            # Not a form post: another site's page cannot send this without a CORS preflight.
            return JSONResponse({"error": "send application/json"}, status_code=415)
        try:
            send_req = PageSend.from_json(await request.json())
        except (ValueError, TicketError) as exc:
            return JSONResponse({"error": f"bad request: {exc}"}, status_code=400)
        if chat.streaming_count() >= chat.max_streams:
            # Gradio's queue bounds its own events; this route would otherwise start replies past it.
            return JSONResponse({"error": "the panel is already streaming its limit of "
                                          f"{chat.max_streams} replies: this one waits in its queue"}, status_code=409)
        try:
            # In a worker thread: sending may resolve the endpoint (a short probe) and writes SQLite.
            turn = await anyio.to_thread.run_sync(start, send_req)
        except (ChatError, TicketError) as exc:
            return JSONResponse({"error": str(exc)}, status_code=409)
        return StreamingResponse(follow_events(turn, send_req.ticket, book), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return send
