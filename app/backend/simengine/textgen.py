"""Deterministic plausible text for the SIMULATED engine: one token = one word (with its space).

A request's output depends only on (seed, prompt text, sampling fields), so equal requests under the
same MOET_SIM_SEED stream equal text.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Iterator

_REASONING_OPENERS = (
    "Let me think about this.", "Okay, the user is asking about", "First, I need to work out",
    "Let me break this down.", "Hmm, consider what is being asked:",
)
_ANSWER_OPENERS = ("Here is", "In short,", "The answer:", "Summary:", "To do this,")
_WORDS = (
    "the a an this that each every some model expert layer token cache pool memory request stream "
    "engine value result step function data system server client queue buffer batch kernel tensor "
    "plane slot weight router path file process thread signal state event error check test case "
    "means keeps uses needs makes gives shows holds moves reads writes builds returns sends counts "
    "first next last small large fast slow stable exact native simple careful correct likely "
    "quickly then also only still again here there because while when if so and but or with from "
    "into over under about after before between within across per by for of to in on at as"
).split()
_CONNECT = frozenset("the a an this that each every some of to in on at as by for with from into".split())


@dataclass(frozen=True)
class Plan:
    """How long a reply is and where the reasoning ends (in tokens)."""

    natural_tokens: int  # tokens before the model would emit EOS
    reasoning_tokens: int  # the first `reasoning_tokens` tokens are chain-of-thought


def request_rng(seed: int, key: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def make_plan(rng: random.Random, thinking: bool) -> Plan:
    natural = rng.randint(80, 420)
    reasoning = int(natural * rng.uniform(0.2, 0.4)) if thinking else 0
    return Plan(natural_tokens=natural, reasoning_tokens=reasoning)


def _sentence(rng: random.Random, opener: str | None) -> list[str]:
    if opener and opener.endswith("."):
        return opener.split()  # a complete sentence on its own
    words: list[str] = opener.split() if opener else []
    n = rng.randint(6, 16)
    prev = ""
    for _ in range(n):
        w = rng.choice(_WORDS)
        if w == prev:
            continue
        words.append(w)
        prev = w
    while words and words[-1] in _CONNECT and len(words) > 2:
        words.pop()
    if words:
        words[0] = words[0][:1].upper() + words[0][1:]
        words[-1] += "."
    return words


def tokens(rng: random.Random, opener_pool: tuple[str, ...], first_word: str | None = None) -> Iterator[str]:
    """Endless word tokens; each carries its leading space except the very first."""
    first = True
    if first_word:
        yield first_word
        first = False
    opener: str | None = rng.choice(opener_pool)
    while True:
        for w in _sentence(rng, opener):
            yield w if first else " " + w
            first = False
        opener = None if not (opener and opener.endswith(".")) else ""
        if rng.random() < 0.12:
            yield "\n\n" + rng.choice(_WORDS).capitalize()


def reasoning_tokens(rng: random.Random) -> Iterator[str]:
    return tokens(rng, _REASONING_OPENERS)


def answer_tokens(rng: random.Random, label: str = "") -> Iterator[str]:
    return tokens(rng, _ANSWER_OPENERS, first_word=label or None)


def count_prompt_tokens(text: str) -> int:
    """Rough tokenizer stand-in: ~1.3 tokens per word, at least 1."""
    return max(1, round(len(text.split()) * 1.3) + text.count("\n") // 4)
