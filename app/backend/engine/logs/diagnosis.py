"""Classify an engine failure from (exit code, OOMKilled, log tail) — a pure function.

The rules are ordered: the most specific root cause wins (vLLM prints the root cause *above* a long
API-server traceback, docs/engine.md "Engine facts", so the whole tail is searched, not just the last line).
Texts of the fixes come from the model card (docs/model-card.txt; quotes in “ ” are its exact words, checked by
tests/test_card_wording.py) and the boot-guard texts in docs/engine.md ("Engine facts").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from app.backend.contracts import Diagnosis

CARD_ECC = "“Turn ECC off (sudo nvidia-smi -e 0 + reboot). Server-Edition cards ship with it enabled; it costs ~6 GiB”."
CARD_NO_RECOVERY = (
    "The card: “FP4 recovery is mandatory (this one is solid). Serving with no recovery scored worst on 6 of 6 rungs” "
    "(“no FP4 recovery at all” measured 4.96/30 at 85.4 tok/s); “It does not degrade gracefully, it decoheres”."
)
CARD_PIN = (
    "The card: “Without the pin the cache silently MISSES, the engine re-stages the whole checkpoint (~51 GiB host RAM) "
    "and small hosts get OOM-killed with no moe_w2 log line to explain it” (small: “less than ~64 GB of RAM”)."
)


@dataclass(frozen=True)
class _Rule:
    reason: str
    title: str
    explanation: str
    fix: str
    pattern: re.Pattern[str]


def _rx(*alternatives: str) -> re.Pattern[str]:
    return re.compile("|".join(alternatives))


# Text rules, most specific first.
TEXT_RULES: tuple[_Rule, ...] = (
    _Rule(
        "image_missing", "Engine image missing",
        "Docker has no image with the recipe's tag on this host (nothing can be pulled here).",
        "Build it: `moet-panel engine build-image --source <vLLM-Moet checkout at the recipe commit>` "
        "(demo mode: `moet-panel simulate-engine --build-image`).",
        _rx(r"No such image", r"pull access denied", r"image .* not found", r"manifest unknown"),
    ),
    _Rule(
        "port_in_use", "Port already in use",
        "Another process is listening on the engine's port, so the API server could not bind.",
        "Stop whatever holds the port (`ss -ltnp | grep :<port>`), or change serve.port in the recipe.",
        _rx(r"[Aa]ddress already in use", r"Errno 98", r"port .* is already (?:bound|in use)"),
    ),
    _Rule(
        "model_runner_v2", "Model Runner V2 incompatibility",
        "The card: “The 2-bit expert path and Model Runner V2 are mutually exclusive, so the 0731 checkpoint's DSpark "
        "blocks cannot be used here regardless of the dspark_* config keys.”",
        "Remove --speculative-config (the card: “DSpark (k=1/2/3) fails at engine init”). “N-gram spec decode does "
        "boot, if you want to experiment.”",
        # Not a bare "Model Runner V2": upstream vLLM on CPU logs "Model Runner V2 requires Triton; using the
        # V1 model runner instead." on every healthy boot (docs/real-engine.md).
        _rx(r"not integrated with Model Runner V2", r"Error.*Model Runner V2"),
    ),
    _Rule(
        "boot_guard", "Boot guard refused the configuration",
        "vLLM-Moet's load-time guard found the profile's settings incoherent and refused to serve.",
        "Read the quoted guard message: it names the setting to change (e.g. raise VLLM_MOE_W2_DELTA_GB, disable "
        "the gate, or set the FORCE_* consent valve the card uses). Re-check custom profile env against the card.",
        _rx(
            r"RESIDENT planes do not fit", r"BELOW the working-set floor", r"below the FIRE FLOOR",
            r"VLLM_MOE_W2_GATE=1 but no FP4 delta tier", r"VLLM_MOE_W2_PREFILL_T=\d+ is below",
            r"VLLM_MOE_W2 x micro-batching", r"cannot hold even one prefill layer",
            r"VLLM_MOE_W2_REPLAY_MODE must be", r"VLLM_MOE_W2_FP_MAX must be positive",
            r"VLLM_MOE_W2_ZERO_MODE must be one of", r"VLLM_MOE_W2_DENSE_FP8 is an unsafe",
            r"VLLM_MOE_W2 does not support", r"VLLM_MOE_W2 kernels use BF16",
        ),
    ),
    _Rule(
        "wrong_gpu", "SM120 kernels unavailable on this GPU",
        "The moe_w2 cubins are built for sm_120 (RTX PRO 6000 Blackwell); this device could not load them.",
        "Serve on an sm_120 GPU (the recipe's requirement), or use the simulated recipe for a demo.",
        _rx(r"moe_w2_cubit unavailable", r"moe_w2 cubins missing"),
    ),
    _Rule(
        "cuda_oom_at_load", "CUDA out of memory at load",
        "The GPU ran out of memory while loading (the card: “VRAM at 256K: ~93.8 GiB of 96”).",
        "Free the GPU (other processes). " + CARD_ECC + " Keep PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and "
        "--kv-cache-memory-bytes 2147483648 from the card (util-based KV sizing overcommits and OOMs at load); "
        "keep VLLM_MOE_W2_DELTA_GB at the card's 7 (the card: “768 slots (9 GiB) measured no better (routing has a long "
        "tail), and 10 GiB does not fit at 256K”).",
        _rx(r"CUDA out of memory", r"torch\.OutOfMemoryError", r"OutOfMemoryError: CUDA",
            r"No available memory for the cache blocks", r"KV cache is needed, which is larger than the available"),
    ),
    _Rule(
        "missing_model_files", "Model files missing",
        "The engine could not find the checkpoint / cache files it was pointed at (mount empty or incomplete).",
        "Finish the downloads (`moet-panel download`), check the data dir mounts (`moet-panel command --profile ID`), "
        "then start again.",
        _rx(r"does not appear to have a file named", r"Can't load the configuration", r"is not a local folder",
            r"No such file or directory: '/model", r"FileNotFoundError", r"model path .* does not exist",
            r"missing model files"),
    ),
    _Rule(
        "engine_argument_refused", "vLLM refused an engine argument",
        "vLLM checked the engine arguments against the model and the host before loading anything and refused "
        "them; its own message is quoted below.",
        "Change the argument the message names in the profile (custom profiles: Engine tab), e.g. keep "
        "--max-model-len within the model's max_position_embeddings, then start again.",
        # upstream vLLM 0.32: pydantic's "ValidationError: 1 validation error for ModelConfig" then
        # "  Value error, <why>"; argparse's "error: argument --x: invalid int value" (docs/real-engine.md)
        _rx(r"ValidationError: \d+ validation errors? for \w+", r"^\s*Value error, ",
            r": error: (?:argument --|unrecognized arguments)"),
    ),
)

KILLED_CODES = (137, -9)


def classify(
    exit_code: int | None,
    oom_killed: bool,
    lines: Iterable[str],
    *,
    cache_miss: bool = False,
    hint: str = "",
) -> Diagnosis:
    """Explain why an engine run failed.

    Args:
        exit_code: container/process exit code (None when still running or unknown).
        oom_killed: Docker's State.OOMKilled.
        lines: the log tail (stdout and stderr, ≥250 lines), oldest first.
        cache_miss: the boot printed `planes built` lines (planes-cache identity miss).
        hint: a reason the controller already knows: "pool_not_loaded", "boot_timeout",
            "image_missing", "port_in_use", "gpu_not_released", "killed_by_user".
    """
    tail = [ln for ln in lines if ln.strip()]
    if hint and hint in HINTS:
        return _with_evidence(HINTS[hint], _grep(tail, _EVIDENCE.get(hint)))
    if oom_killed or (exit_code in KILLED_CODES and (cache_miss or _grep(tail, _HOST_OOM_RE))):
        return _with_evidence(_host_oom(cache_miss), _grep(tail, _HOST_OOM_RE) or tail[-3:])
    for rule in TEXT_RULES:
        evidence = _grep(tail, rule.pattern)
        if evidence:
            return Diagnosis(rule.reason, rule.title, rule.explanation, rule.fix, evidence)
    if exit_code in KILLED_CODES:
        return _with_evidence(KILLED, tail[-3:])
    if cache_miss:
        return _with_evidence(CACHE_MISS, _grep(tail, re.compile(r"planes built|planes cache")))
    if exit_code in (0, 143) and _grep(tail, _CLEAN_SHUTDOWN_RE):
        return _with_evidence(STOPPED_OUTSIDE, _grep(tail, _CLEAN_SHUTDOWN_RE))
    code = "unknown" if exit_code is None else str(exit_code)
    return Diagnosis(
        "unexpected_exit", f"Engine exited unexpectedly (exit code {code})",
        "No known failure signature was found in the last log lines.",
        "Read the log tail below (Logs view / `moet-panel engine logs`); the root cause is usually above the "
        "API server's traceback.",
        tuple(tail[-5:]),
    )


def cache_miss_warning() -> str:
    """The loud boot-time warning when `planes built` lines appear."""
    return (
        "planes cache MISS: the engine is re-quantizing the checkpoint (~51 GiB host staging). "
        "Check that VLLM_MOE_W2_CKPT_ID equals the cache's meta.json ckpt_id. " + CARD_PIN
    )


_HOST_OOM_RE = re.compile(r"Out of memory: Killed process|oom-kill|host OOM|Killed$|MemoryError")


def _host_oom(cache_miss: bool) -> Diagnosis:
    why = "The kernel's OOM killer stopped the engine (exit 137 / OOMKilled): host RAM ran out."
    if cache_miss:
        why += " The boot was re-building planes (cache MISS), which stages ~51 GiB on the host."
    return Diagnosis(
        "host_oom_kill", "Host out of memory — engine OOM-killed", why,
        "Pin the checkpoint identity (VLLM_MOE_W2_CKPT_ID from the cache's meta.json) so the planes cache hits; "
        "" + CARD_PIN + " Otherwise add host RAM or stop other memory users.",
    )


# uvicorn's orderly shutdown: someone ran `docker stop` (SIGTERM) on a healthy engine.
_CLEAN_SHUTDOWN_RE = re.compile(r"Shutting down|Finished server process")
STOPPED_OUTSIDE = Diagnosis(
    "stopped_outside_panel", "Engine was stopped outside the panel",
    "The engine shut down cleanly (SIGTERM, e.g. `docker stop`), but not through the panel.",
    "Nothing is broken: start it again from the Engine tab (or `moet-panel engine start`).",
)

KILLED = Diagnosis(
    "killed", "Engine killed (SIGKILL, exit 137)",
    "The engine received SIGKILL from outside (docker kill, a stop that ran past its grace period, or the OOM "
    "killer acting on a child process).",
    "If nobody killed it on purpose, check host memory (`dmesg | grep -i oom`) and the log tail; then start again.",
)
CACHE_MISS = Diagnosis(
    "cache_identity_miss", "Planes-cache identity MISS",
    "The engine built planes instead of reading them from the cache: the cache's identity did not match.",
    "Set VLLM_MOE_W2_CKPT_ID to the ckpt_id in <data>/planescache/v2/*/tp1-rank0/meta.json (the recipe pins it). "
    + CARD_PIN,
)
HINTS: dict[str, Diagnosis] = {
    "pool_not_loaded": Diagnosis(
        "pool_not_loaded", "failed: pool not loaded",
        "The engine answers HTTP but its FP4 recovery pool was not allocated (no `moe_w2 delta tier: N slots` line "
        "with N > 0). It would be fast and broken. " + CARD_NO_RECOVERY,
        "Keep VLLM_MOE_W2_DELTA_GB=7 (the card's value) and VLLM_MOE_W2_DELTA unset/1; with DELTA_GB=auto, free "
        "VRAM so more than the reserve is left after the KV cache.",
    ),
    "boot_timeout": Diagnosis(
        "boot_timeout", "Boot timed out",
        "The engine did not become ready within the recipe's boot timeout.",
        "Look at the boot phase it stopped in (Logs view). A cold planes-cache build takes far longer than a warm "
        "boot: pin VLLM_MOE_W2_CKPT_ID so the cache hits.",
    ),
    "image_missing": Diagnosis(
        TEXT_RULES[0].reason, TEXT_RULES[0].title, TEXT_RULES[0].explanation, TEXT_RULES[0].fix
    ),
    "port_in_use": Diagnosis(
        TEXT_RULES[1].reason, TEXT_RULES[1].title,
        "The engine's port is already bound by something that is not this panel's engine; a stale server's "
        "/health could be mistaken for the new one, so the panel refuses to start.",
        TEXT_RULES[1].fix,
    ),
    "gpu_not_released": Diagnosis(
        "gpu_not_released", "GPU memory was not released",
        "After the previous engine stopped, the GPU memory stayed in use past the deadline.",
        "Check `nvidia-smi` for leftover processes (another container or a zombie worker) and stop them.",
    ),
    "preflight_failed": Diagnosis(
        "preflight_failed", "Preflight check failed",
        "At least one preflight item failed and was not overridden.",
        "Fix the failing items (each shows its fix) or override them explicitly.",
    ),
    "name_conflict": Diagnosis(
        "name_conflict", "Container name held by a foreign container",
        "A container that this panel did not create already uses the engine's container name.",
        "Inspect it (`docker ps -a`); remove or rename it yourself — the panel does not clobber containers it "
        "does not own.",
    ),
    "image_building": Diagnosis(
        "image_building", "Engine image still being built",
        "The engine image is not present yet, but a build of it is running.",
        "Nothing to do: the panel starts the engine when the build has finished.",
    ),
    "docker_unreachable": Diagnosis(
        "docker_unreachable", "Docker daemon unreachable",
        "The panel could not talk to the Docker daemon.",
        "Is dockerd running (`systemctl status docker`)? Are you in the docker group? Is DOCKER_HOST right?",
    ),
}
_EVIDENCE: dict[str, re.Pattern[str]] = {
    "pool_not_loaded": re.compile(r"delta tier|pool disabled|VLLM_MOE_W2_DELTA"),
    "port_in_use": re.compile(r"[Aa]ddress already in use"),
}


def _grep(lines: list[str], pattern: re.Pattern[str] | None, keep: int = 3) -> tuple[str, ...]:
    if pattern is None:
        return ()
    return tuple(ln.strip() for ln in lines if pattern.search(ln))[-keep:]


def _with_evidence(d: Diagnosis, evidence: tuple[str, ...] | list[str]) -> Diagnosis:
    return Diagnosis(d.reason, d.title, d.explanation, d.fix, tuple(x.strip() for x in evidence))
