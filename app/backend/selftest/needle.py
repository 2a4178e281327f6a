"""Needle-in-a-haystack prompts measured in the engine's own tokens (vLLM's /tokenize, never characters).

The card's test: a unique code at depths 0.05 / 0.50 / 0.95 of a 64K and a 256K prompt; pass = the
exact code in the answer. The haystack is a repeated neutral paragraph; the builder estimates the
paragraph count from one /tokenize call, then corrects with a few more until the whole prompt is
within one paragraph under the target (tokenizers are not additive, so the total is always re-counted).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

DEPTHS = (0.05, 0.50, 0.95)
FILLER = ("The river bends twice before it reaches the old mill, where the stones are worn smooth by a "
          "century of water. Farmers bring grain in autumn and the miller keeps a ledger of every sack. ")
QUESTION = "What is the secret code for the vault mentioned in the text above? Answer with the code only."
Tokenize = Callable[[list[dict[str, str]]], int]


@dataclass(frozen=True)
class NeedlePrompt:
    target_tokens: int
    depth: float
    code: str
    messages: list[dict[str, str]]
    tokens: int  # as counted by the engine


def needle_code(length: int, depth: float, salt: str = "") -> str:
    """A unique, deterministic code per (length, depth): e.g. NDL-3F9A0C1B."""
    return "NDL-" + hashlib.sha256(f"{length}:{depth}:{salt}".encode()).hexdigest()[:8].upper()


def _messages(paragraphs: int, depth: float, code: str) -> list[dict[str, str]]:
    at = round(paragraphs * depth)
    needle = f"The secret code for the vault is {code}. "
    body = FILLER * at + needle + FILLER * (paragraphs - at)
    return [{"role": "user", "content": body + "\n\n" + QUESTION}]


def build_needle(tokenize: Tokenize, target_tokens: int, depth: float, salt: str = "") -> NeedlePrompt:
    """The largest haystack whose prompt is <= target_tokens engine tokens, needle at `depth`."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must be within 0..1, got {depth}")
    code = needle_code(target_tokens, depth, salt)
    base = tokenize(_messages(0, depth, code))
    per = max(1.0, (tokenize(_messages(8, depth, code)) - base) / 8)
    n = max(0, int((target_tokens - base) / per))
    count = tokenize(_messages(n, depth, code))
    for _ in range(6):  # each pass lands closer; 6 is far more than the estimate ever needs
        if count > target_tokens:
            n = max(0, n - max(1, int((count - target_tokens) / per) + 1))
        elif target_tokens - count >= per * 1.5:
            n += max(1, int((target_tokens - count) / per) - 1)
        else:
            break
        count = tokenize(_messages(n, depth, code))
    if count > target_tokens:
        raise ValueError(f"cannot fit a needle prompt in {target_tokens} tokens (the question alone is {base})")
    return NeedlePrompt(target_tokens, depth, code, _messages(n, depth, code), count)


def parse_lengths(text: str) -> list[int]:
    """'64k,256k' -> [65536, 262144]; plain numbers are tokens. Raises ValueError with the bad part."""
    out = []
    for part in (p.strip().lower() for p in text.split(",")):
        if not part:
            continue
        mult = 1024 if part.endswith("k") else 1
        try:
            value = int(float(part[:-1] if mult > 1 else part) * mult)
        except ValueError:
            raise ValueError(f"needle length {part!r} is not a number of tokens like 64k or 65536") from None
        if value < 256:
            raise ValueError(f"needle length {part!r} is too short (at least 256 tokens)")
        out.append(value)
    return out
