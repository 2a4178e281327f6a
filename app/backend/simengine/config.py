"""Configuration of the SIMULATED vLLM-Moet engine: vLLM-like argv + env knobs -> SimEngineConfig.

STDLIB ONLY: this package is copied alone into a FROM-scratch image.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Mapping, Sequence

FAIL_MODES = (
    "oom_at_load",
    "crash_mid_generation",
    "pool_disabled",
    "slow_boot",
    "cache_miss",
    "host_oom",
    "hang_mid_generation",  # stops producing tokens mid-answer while /health stays 200 (a wedged vLLM)
    "boot_guard",  # the load-time guard refuses the configuration (docs/simengine.md), exit 1
    "hang_after_ready",  # wedged once ready: /health 200, requests accepted but never run, no token (issue 32)
)
FAIL_ALIASES = {"health_without_pool": "pool_disabled"}  # the brief's name for the same symptom
SELFTEST_ENV = ("MOET_SIM_NEEDLE_MAX_TOKENS", "MOET_SIM_DEGRADE", "MOET_SIM_DEGRADE_AFTER_S")  # quality.py
REASONING_MODES = ("reasoning", "reasoning_content", "think_tags", "none")
# The ckpt id the simulated planes cache was "built" with (the simulated recipe pins this value);
# any other VLLM_MOE_W2_CKPT_ID (or none) is a planes-cache MISS, as on the real engine.
DEFAULT_EXPECTED_CKPT_ID = "8863d864b7c75cde7493abc5899bdfe9e6dd16f6dab445961416f6e407c842b8"


@dataclass
class SimEngineConfig:
    """Everything the simulated engine needs. Defaults mimic the card's profile 1 on one GPU."""

    port: int = 8000
    host: str = "127.0.0.1"
    uds: str = ""  # a unix socket path, as vLLM's --uds: set, the engine listens there and opens no TCP port
    served_name: str = "deepseek-v4-flash"
    model: str = "/model"
    max_model_len: int = 262144
    max_num_seqs: int = 256
    decode_tok_s: float = 48.9
    prefill_tok_s: float = 6000.0
    boot_s: float = 3.0
    seed: int = 0
    fail: str = ""  # one of FAIL_MODES, or "" for a healthy engine
    stats_interval_s: float = 10.0  # vLLM's VLLM_LOG_STATS_INTERVAL
    crash_after_tokens: int = 16  # crash_mid_generation: tokens of the first request before the crash
    reasoning_mode: str = "reasoning"  # default for requests without sim_reasoning_mode
    expected_ckpt_id: str = DEFAULT_EXPECTED_CKPT_ID
    env: dict[str, str] = field(default_factory=dict)  # the VLLM_MOE_W2* knobs as seen by the engine
    pid: int = 0  # pid shown in log prefixes; 0 = os.getpid()
    extra_args: list[str] = field(default_factory=list)  # flags accepted but ignored (a real server uses them)

    def __post_init__(self) -> None:
        self.fail = FAIL_ALIASES.get(self.fail, self.fail)
        if self.fail and self.fail not in FAIL_MODES:
            raise ValueError(f"MOET_SIM_FAIL={self.fail!r} is not one of {', '.join(FAIL_MODES)}")
        if self.reasoning_mode not in REASONING_MODES:
            raise ValueError(f"reasoning mode {self.reasoning_mode!r} is not one of {', '.join(REASONING_MODES)}")
        if self.decode_tok_s <= 0:
            raise ValueError(f"decode_tok_s must be > 0, got {self.decode_tok_s}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0..65535, got {self.port}")

    def env_str(self, name: str, default: str = "") -> str:
        return self.env.get(name, default).strip()

    def env_float(self, name: str, default: float) -> float:
        raw = self.env_str(name)
        try:
            return float(raw) if raw else default
        except ValueError:
            return default

    def env_int(self, name: str, default: int) -> int:
        raw = self.env_str(name)
        try:
            return int(float(raw)) if raw else default
        except ValueError:
            return default


def _parse_len(text: str) -> int:
    """vLLM accepts '262144', '256k', '1m' for --max-model-len."""
    t = text.strip().lower()
    mult = {"k": 1024, "m": 1024 * 1024}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def _arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="simengine", add_help=False, allow_abbrev=False)
    p.add_argument("--port", type=int)
    p.add_argument("--host")
    p.add_argument("--uds")
    p.add_argument("--model")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--max-model-len")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--seed", type=int)
    return p


def _float_env(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r} is not a number") from exc


def config_from_env_and_args(argv: Sequence[str], environ: Mapping[str, str]) -> SimEngineConfig:
    """Read the vLLM-like command line (unknown flags are accepted and ignored) and the env knobs."""
    args = list(argv)
    while args and args[0] in ("vllm", "serve"):  # `vllm serve MODEL ...` form
        args.pop(0)
    positional_model = None
    if args and not args[0].startswith("-"):
        positional_model = args.pop(0)
    ns, extra = _arg_parser().parse_known_args(args)
    cfg = SimEngineConfig()
    if ns.port is not None:
        cfg.port = ns.port
    if ns.host:
        cfg.host = ns.host
    if ns.uds:
        cfg.uds = ns.uds
    cfg.model = ns.model or positional_model or cfg.model
    if ns.served_model_name:
        cfg.served_name = ns.served_model_name[0]
    if ns.max_model_len:
        cfg.max_model_len = _parse_len(ns.max_model_len)
    if ns.max_num_seqs:
        cfg.max_num_seqs = max(1, ns.max_num_seqs)
    cfg.extra_args = extra
    cfg.decode_tok_s = _float_env(environ, "MOET_SIM_DECODE_TOK_S", cfg.decode_tok_s)
    cfg.prefill_tok_s = _float_env(environ, "MOET_SIM_PREFILL_TOK_S", cfg.prefill_tok_s)
    cfg.boot_s = _float_env(environ, "MOET_SIM_BOOT_S", cfg.boot_s)
    cfg.seed = int(_float_env(environ, "MOET_SIM_SEED", ns.seed if ns.seed is not None else cfg.seed))
    cfg.fail = environ.get("MOET_SIM_FAIL", "").strip().lower()
    cfg.stats_interval_s = max(0.05, _float_env(environ, "VLLM_LOG_STATS_INTERVAL", cfg.stats_interval_s))
    cfg.crash_after_tokens = int(_float_env(environ, "MOET_SIM_CRASH_AFTER_TOKENS", cfg.crash_after_tokens))
    cfg.reasoning_mode = environ.get("MOET_SIM_REASONING_MODE", cfg.reasoning_mode).strip() or cfg.reasoning_mode
    cfg.expected_ckpt_id = environ.get("MOET_SIM_EXPECTED_CKPT_ID", cfg.expected_ckpt_id).strip()
    cfg.env = {k: v for k, v in environ.items() if k.startswith("VLLM_MOE_W2") or k == "VLLM_LOGGING_PREFIX"}
    cfg.env.update({k: environ[k] for k in SELFTEST_ENV if k in environ})  # read by quality.py
    cfg.__post_init__()  # re-validate after the updates
    return cfg
