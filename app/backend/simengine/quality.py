"""SIMULATED model behaviour the self-test and the A/B need: needles, profile-dependent answers, slow-down.

STDLIB ONLY (this package is copied alone into a FROM-scratch image). Everything here is made up and
deterministic; docs/simengine.md ("Self-test support") says what each knob does.

- Needles: a prompt holding "The secret code ... is CODE." is answered with CODE while the prompt is
  within the validated context (MOET_SIM_NEEDLE_MAX_TOKENS, default the card's 262144) and missed past
  it — the card's "3/3 depths at 256K, 0/3 at 288K" cliff.
- Profile quality: the pool knobs set a quality tier (freq = 0, PROMO_HYST>1 = 1, need = 2, no pool = 3).
  The same request gets the same base answer on every profile (the card: ~30% of cells were exact
  ties), and a worse tier breaks more answers off early with the card's decoherence symptom.
- Degraded decode (MOET_SIM_DEGRADE=<factor>, MOET_SIM_DEGRADE_AFTER_S): the decode rate drops to
  factor × nominal after that many seconds of being ready, for the panel's drift alert.
"""

from __future__ import annotations

import random
import re

from .config import SimEngineConfig

NEEDLE_RE = re.compile(r"The secret code(?: [a-z ]{0,40})? is ([A-Z]{2,5}-[0-9A-Z]{4,12})\.")
DEFAULT_NEEDLE_MAX_TOKENS = 262144
MISSED_ANSWER = "I could not find a secret code in the text."
DECOHERENCE = "I'll now write the final code."
# tier -> (probability an answer is broken off, fraction of its natural length kept when it is)
_BREAK = {0: (0.0, (1.0, 1.0)), 1: (0.55, (0.55, 0.9)), 2: (0.95, (0.15, 0.45)), 3: (1.0, (0.05, 0.2))}


def needle_max_tokens(cfg: SimEngineConfig) -> int:
    return cfg.env_int("MOET_SIM_NEEDLE_MAX_TOKENS", DEFAULT_NEEDLE_MAX_TOKENS)


def quality_tier(cfg: SimEngineConfig) -> int:
    """0 = the card's profile 1 (freq, undamped), 1 = damped (PROMO_HYST>1), 2 = need, 3 = no FP4 pool."""
    if cfg.fail == "pool_disabled" or cfg.env_str("VLLM_MOE_W2_DELTA_GB", "2") in ("0", "0.0") \
            or cfg.env_str("VLLM_MOE_W2_DELTA", "1") == "0":
        return 3
    if cfg.env_str("VLLM_MOE_W2_DELTA_POLICY", "freq").lower() == "need" and cfg.env_str("VLLM_MOE_W2_GATE", "0") != "1":
        return 2
    return 1 if cfg.env_float("VLLM_MOE_W2_PROMO_HYST", 0.0) > 1 else 0


def needle_answer(prompt_text: str, prompt_tokens: int, max_tokens_ok: int) -> str | None:
    """The answer to a needle prompt (None when the prompt holds no needle)."""
    m = NEEDLE_RE.search(prompt_text)
    if m is None:
        return None
    return m.group(1) if prompt_tokens <= max_tokens_ok else MISSED_ANSWER


# The SIMULATED build `next` is a little faster (config.BUILD_VARIANTS) and a little worse: the best tier breaks
# some answers off too, so the A/B between builds has something to find.
_BREAK_NEXT = {0: (0.2, (0.6, 0.95))}


def broken_length(rng: random.Random, tier: int, natural: int, build: str = "") -> int | None:
    """Tokens after which this profile breaks the answer off (None = the answer is whole)."""
    p, (lo, hi) = (_BREAK_NEXT if build == "next" else {}).get(tier, _BREAK.get(tier, _BREAK[0]))
    if p <= 0 or rng.random() >= p:
        return None
    return max(3, int(natural * rng.uniform(lo, hi)))


def degrade(cfg: SimEngineConfig) -> tuple[float, float] | None:
    """(factor, after_s) of the degraded-decode mode, or None when it is off."""
    factor = cfg.env_float("MOET_SIM_DEGRADE", 1.0)
    if not 0 < factor < 1:
        return None
    return factor, max(0.0, cfg.env_float("MOET_SIM_DEGRADE_AFTER_S", 0.0))
