"""`moet-panel chat PROMPT`: stream one answer from any OpenAI-compatible server to the terminal.

Reasoning is printed dim, the answer normally, then the stats line (TTFT, tok/s, tokens, wall time).
Default endpoint: the recipe's (http://127.0.0.1:8000); sampling defaults: the card's.
"""

from __future__ import annotations

import argparse
import sys
import time

import httpx
from rich.console import Console

from app.backend.chat.client import ChatRequest, ChatStream, SamplingParams
from app.backend.chat.events import ContentDelta, Finished, ReasoningDelta, ReclassifyAsReasoning, StreamError
from app.backend.chat.models import MessageStats
from app.backend.chat.stats import StatsRecorder, format_stats
from app.backend.engine.runtime.client import EngineClient, base_url
from app.cli.main import add_common, settings_from


def register(subs: argparse._SubParsersAction) -> None:
    p = subs.add_parser("chat", help="stream one answer from the engine (or any OpenAI-compatible server)")
    add_common(p, json_help="accepted; chat prints the streamed answer, no data")
    p.add_argument("prompt", metavar="PROMPT", help="the message; '-' reads it from stdin")
    p.add_argument("--base-url", help="server root, e.g. http://127.0.0.1:8000, or an engine's socket "
                   "unix:/PATH (default: the panel's engine, on its socket in the data dir)")
    p.add_argument("--model", help="model name to request (default: the recipe's served name, else the server's first)")
    p.add_argument("--system", default="", help="system prompt")
    p.add_argument("--max-tokens", type=int, default=None, help="cap on generated tokens (default: server's limit)")
    p.add_argument("--temperature", type=float, help="default from the card (1.0); never 0 on a reasoning model")
    p.add_argument("--top-p", type=float, help="default from the card (1.0)")
    p.add_argument("--min-p", type=float, help="default from the card (0.05)")
    p.add_argument("--hide-reasoning", action="store_true", help="do not print the model's thinking")
    p.add_argument("--api-key", default=None, help="API key if the server was started with --api-key")
    p.set_defaults(func=run)


def _pick_model(client: EngineClient, wanted: str | None, recipe_name: str) -> str:
    if wanted:
        return wanted
    try:
        served = client.models()
    except (httpx.HTTPError, ValueError, AttributeError):  # the chat request itself reports an unreachable server
        return recipe_name
    return recipe_name if (recipe_name in served or not served) else served[0]


def run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    recipe = settings.recipe
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = Console(highlight=False, soft_wrap=True)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        err.print("moet-panel chat: the prompt is empty", markup=False)
        return 2
    s = recipe.sampling
    sampling = SamplingParams(
        temperature=s.temperature if args.temperature is None else args.temperature,
        top_p=s.top_p if args.top_p is None else args.top_p,
        min_p=s.min_p if args.min_p is None else args.min_p,
        max_tokens=args.max_tokens,
    )
    if sampling.temperature <= 0:
        err.print(f"warning: temperature 0 — {s.never_zero_note}", style="yellow", markup=False)
    url = args.base_url or base_url(recipe, settings.data_dir)
    client = EngineClient(url, api_key=args.api_key)
    model = _pick_model(client, args.model, recipe.model.served_name)
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": prompt}
    ]
    recorder = StatsRecorder(started=time.monotonic())
    in_reasoning = False
    failure: StreamError | None = None
    finish: str | None = None
    try:
        for ev in ChatStream(client, ChatRequest(model, messages, sampling)):
            recorder.observe(ev)
            if isinstance(ev, ReasoningDelta) and not args.hide_reasoning:
                in_reasoning = True
                out.print(ev.text, style="dim", end="", markup=False)
            elif isinstance(ev, ContentDelta):
                if in_reasoning:
                    out.print("\n")
                    in_reasoning = False
                out.print(ev.text, end="", markup=False)
            elif isinstance(ev, ReclassifyAsReasoning):
                out.print("\n[the text above was the model's thinking]\n", style="dim", markup=False)
            elif isinstance(ev, StreamError):
                failure = ev
            elif isinstance(ev, Finished):
                finish = ev.reason
    except KeyboardInterrupt:  # leaving the loop closed the stream: the server aborts the request
        out.print("\n[stopped]", style="yellow", markup=False)
        return 130
    finally:
        client.close()
    if failure is not None and recorder.first_token is None:
        hint = " Start the engine (`moet-panel engine start`) or pass --base-url." if failure.kind == "connect" else ""
        err.print(f"moet-panel chat: {failure.message}.{hint}", markup=False)
        return 1
    stats = recorder.finish(time.monotonic(), MessageStats(model=model, base_url=url))
    stats.finish_reason = finish
    out.print("")
    if failure is not None:
        err.print(f"moet-panel chat: {failure.message} (partial answer above)", markup=False)
    err.print(format_stats(stats).replace("profile unknown · ", ""), style="cyan", markup=False)
    return 1 if failure is not None else 0
