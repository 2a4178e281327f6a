"""Alerts: each one says what it means (with the card's numbers) and what to do.

Rules are small pure functions over an `AlertInputs` bundle, so the hub, `moet-panel engine
status` and the trace CLI all evaluate the same rules.

Churn-trap threshold (why these numbers): the card's trap is ±1536 slots per 320 ms ≈ 57 GB/s
host→device, i.e. ~4800 promotions/s of 12 MiB slots, saturating PCIe gen5 ×16. The healthy
freq manager is rate-limited to PROMOTE (8–16) promotions per pass, one pass per decode step:
at ~50 tok/s that is ≤ 800/s ≈ 9 GiB/s. We alert at **20 GiB/s** of estimated promotion traffic
(> 2× the healthy ceiling, ~⅓ of the trap, ~40% of a gen5 ×16 link), or — independent of slot
size, for scaled-down logs — when the pool is **replaced ≥ 2.5 times per second** (the trap on a
1536-slot pool is 3.1/s; a healthy freq pool measures 0.5–1.5/s in the fixtures).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Iterable, Literal

from app.backend.profiles.registry import ProfileRegistry
from app.backend import oplog
from app.backend.engine.runtime.base import Runtime
from app.backend.contracts import EngineSnapshot, EngineState, GpuSample, LogLine
from app.backend.config.settings import Settings
from app.backend.telemetry.host import HostSample
from app.backend.telemetry.metrics import MetricsSample
from app.backend.telemetry.trace import TraceParser, TraceSnapshot
from app.backend.contracts import GiB

if TYPE_CHECKING:  # the self-test package reads telemetry; the type only, no import at run time
    from app.backend.selftest.drift import DriftReading

Severity = Literal["critical", "warning", "info"]
CHURN_GIB_S = 20.0
CHURN_TURNOVER_PER_S = 2.5
ZERO_COVERAGE_SUMMARIES = 3
VRAM_FULL_FRACTION = 0.98
HOST_RAM_LOW_FRACTION = 0.05
HOST_RAM_LOW_BYTES = 4 * GiB
TRACE_OFF_AFTER_S = 90.0
# Quotes in “ ” are the card's exact words (docs/model-card.txt; tests/test_card_wording.py checks them).
NO_RECOVERY_SCORE = (
    "the card's Study 1 measured “no FP4 recovery at all” at 4.96/30 and 85.4 tok/s, against 11.00/30 for “broad FP4 "
    "coverage (freq pool), gate off”: “fast and broken”"
)
TRACE_HOW = (
    "Start the engine with VLLM_MOE_W2_DELTA_TRACE=1 (the panel adds it to every start it makes; an engine "
    "started by hand or with `moet-panel command --plain` has it off). Trace knobs are read once at import: "
    "an engine restart is needed."
)


@dataclass(frozen=True)
class Alert:
    id: str
    severity: Severity
    title: str
    meaning: str
    action: str
    evidence: str = ""


@dataclass
class AlertInputs:
    trace: TraceSnapshot | None = None
    gpus: list[GpuSample] = field(default_factory=list)
    host: HostSample | None = None
    metrics: MetricsSample | None = None
    engine: EngineSnapshot | None = None
    traffic_seen_s: float | None = None  # seconds of traffic (per /metrics) with no tick line
    policy: str = ""  # VLLM_MOE_W2_DELTA_POLICY of the active profile
    ecc_required_off: bool = False
    ecc_note: str = ""
    drift: DriftReading | None = None  # decode_drift below


def pool_absent(i: AlertInputs) -> Alert | None:
    t = i.trace
    if t is None or not t.pool_disabled:
        return None
    sz = t.sizing
    why = ""
    if sz is not None and sz.auto and sz.free_after_kv_gib is not None:
        why = f" DELTA_GB=auto found {sz.free_after_kv_gib:.2f} GiB free after the KV cache, below the {sz.reserve_gib} GiB reserve."
    return Alert(
        "pool_absent", "critical", "FP4 recovery pool absent (0 slots)",
        f"The engine serves pure 2-bit experts: running without FP4 recovery — {NO_RECOVERY_SCORE}.{why}",
        "Stop the engine and start a card profile (fixed VLLM_MOE_W2_DELTA_GB=7, not auto/0); if it was auto, "
        "free VRAM (other GPU processes, --kv-cache-memory-bytes) so the pool fits.",
        evidence="boot line: pool disabled (0 slots)" if sz and sz.disabled else "summary: 0/0 slots",
    )


def zero_coverage(i: AlertInputs) -> Alert | None:
    t = i.trace
    if t is None or t.pool_disabled:
        return None
    for r in t.ranks:
        if r.last is None or r.summaries < ZERO_COVERAGE_SUMMARIES:
            continue
        if r.last.cached == 0 and r.last.hit_tokens_pct == 0.0:
            need = i.policy == "need"
            return Alert(
                "zero_coverage", "warning" if need else "critical", "FP4 pool empty while serving",
                f"{r.summaries} trace summaries with traffic and no expert resident at FP4: running without FP4 "
                f"recovery — {NO_RECOVERY_SCORE}."
                + (" Under DELTA_POLICY=need only gate fires fill the pool; with the gate off it stays empty "
                   "(the card's profile 3 trade)." if need else ""),
                "Use the max-quality profile (DELTA_POLICY=freq) unless you chose this trade knowingly.",
                evidence=f"{r.key}: tick {r.last.tick}: {r.last.cached}/{r.last.slots} slots, hit-rate 0.0%",
            )
    return None


def churn_trap(i: AlertInputs) -> Alert | None:
    t = i.trace
    if t is None:
        return None
    for r in t.ranks:
        rep = r.replacements_per_s
        if rep is None or r.last is None or r.last.slots <= 0:
            continue
        gib_s = rep * r.slot_bytes / GiB if r.slot_bytes else None
        turnover = rep / r.last.slots
        if (gib_s is not None and gib_s >= CHURN_GIB_S) or turnover >= CHURN_TURNOVER_PER_S:
            est = f"≈ {gib_s:.3g} GiB/s host→device, " if gib_s is not None else ""
            return Alert(
                "churn_trap", "warning", "Pool churn trap: slots thrash",
                f"The pool swaps {rep:.0f} slots/s ({est}the whole pool {turnover:.1f}×/s). The card's trap is "
                "±1536 slots per 320 ms ≈ 57 GB/s, saturating PCIe and cutting decode to ~25 tok/s.",
                "Turn the gate off (VLLM_MOE_W2_GATE=0) or damp promotions (profile 2: PROMO_HYST=8); "
                "a healthy `window +N/-N` is small.",
                evidence=f"{r.key}: window +{r.last.win_promoted}/-{r.last.win_evicted} at tick {r.last.tick}",
            )
    return None


def vram_full(i: AlertInputs) -> Alert | None:
    for g in i.gpus:
        if g.memory_total and g.memory_in_use / g.memory_total > VRAM_FULL_FRACTION:
            return Alert(
                "vram_full", "warning", f"GPU {g.index} VRAM above 98%",
                f"{g.memory_in_use / GiB:.1f} of {g.memory_total / GiB:.1f} GiB in use. The card's recipe runs at "
                "~93.8 of 96 GiB (97.7%); beyond that a longer prompt or another process can OOM the engine.",
                "Close other GPU processes; keep --max-model-len ≤ 262144 and the card's --kv-cache-memory-bytes.",
            )
    return None


def ecc_on(i: AlertInputs) -> Alert | None:
    for g in i.gpus:
        if g.ecc_current:
            return Alert(
                "ecc_on", "warning" if i.ecc_required_off else "info", f"GPU {g.index}: ECC is on",
                i.ecc_note or "ECC reserves part of VRAM on GDDR cards; the card's recipe needs nearly all of it.",
                "If your site allows it: sudo nvidia-smi -e 0, then reboot.",
            )
    return None


THERMAL = frozenset({"sw_thermal", "hw_thermal", "hw_slowdown"})
POWER = frozenset({"sw_power_cap", "hw_power_brake"})


def throttling(i: AlertInputs) -> Alert | None:
    for g in i.gpus:
        hot = THERMAL & set(g.throttle_reasons)
        power = POWER & set(g.throttle_reasons)
        if hot or power:
            kind = "thermal" if hot else "power"
            return Alert(
                f"throttle_{kind}", "warning" if hot else "info", f"GPU {g.index} is {kind}-throttling",
                f"Clocks are held down ({', '.join(sorted(hot | power))}); decode tok/s will be below the card's figures.",
                "Check cooling/airflow and temperature." if hot else
                "Normal at the power limit under load; check `nvidia-smi -q -d POWER` if decode is far below the card.",
            )
    return None


def host_ram_low(i: AlertInputs) -> Alert | None:
    h = i.host
    if h is None or not h.ram_total:
        return None
    if h.ram_available < max(HOST_RAM_LOW_BYTES, 0) or h.ram_available / h.ram_total < HOST_RAM_LOW_FRACTION:
        return Alert(
            "host_ram_low", "warning", "Host RAM low",
            f"{h.ram_available / GiB:.1f} GiB available of {h.ram_total / GiB:.1f} GiB. A planes-cache miss "
            "is what the card warns of: “the engine re-stages the whole checkpoint (~51 GiB host RAM) and small hosts get "
            "OOM-killed with no moe_w2 log line to explain it”.",
            "Pin VLLM_MOE_W2_CKPT_ID (the recipe does) and close memory-hungry processes.",
        )
    return None


def trace_off(i: AlertInputs) -> Alert | None:
    e = i.engine
    if e is None or e.state is not EngineState.READY or i.traffic_seen_s is None:
        return None
    if i.traffic_seen_s < TRACE_OFF_AFTER_S:
        return None
    return Alert(
        "trace_off", "warning", "No pool trace: coverage unknown",
        f"The engine served tokens for {i.traffic_seen_s:.0f} s but printed no `[delta] tick` line, so the panel "
        "cannot show whether the FP4 pool works (the card: “Check the [delta] tick line is present”).",
        TRACE_HOW,
    )


def decode_drift(i: AlertInputs) -> Alert | None:
    """Live single-stream decode below the profile's baseline for a sustained window (selftest/drift.py)."""
    d = i.drift
    if d is None or not d.drifting:
        return None
    causes = [f"GPU {g.index} clocks held down ({', '.join(g.throttle_reasons)})" for g in i.gpus
              if set(g.throttle_reasons) & (THERMAL | POWER)]
    if i.trace is not None and any((r.replacements_per_s or 0) >= 2000 for r in i.trace.ranks):
        causes.append("FP4 pool churn (thousands of slot swaps/s load the PCIe link)")
    if i.host is not None and i.host.swap_total and i.host.swap_used / i.host.swap_total > 0.25:
        causes.append(f"host swap in use ({i.host.swap_used / GiB:.1f} GiB)")
    cause = "; ".join(causes) or "none visible in the telemetry (check the PCIe link in the self-test, other GPU work)"
    return Alert(
        "decode_drift", "warning", f"Decode {d.live_tok_s:.1f} tok/s, below {d.baseline_tok_s:.1f}",
        f"For {d.below_s:.0f} s one stream has decoded at {d.live_tok_s:.1f} tok/s, "
        f"{1 - d.live_tok_s / d.baseline_tok_s:.0%} below the baseline of profile {d.profile_id} "
        f"({d.baseline_source}). Likely cause: {cause}.",
        "Run the self-test (Self-test tab) to see clocks, throttle reasons and the PCIe link during a load.",
    )


@dataclass(frozen=True)
class HoldDown:
    """How long a condition must hold before a person is told (`start_s`), and stay clear before "resolved" is
    sent (`clear_s`): no message for a blip, no flapping on a line the box sits on (docs/telemetry.md#hold-down)."""

    start_s: float
    clear_s: float


# Per alert id. Why these: VRAM sits at the card's own 97.7 % beside the 98 % line, so a crossing must last
# minutes to count; a throttle or a churn burst of seconds is normal under load; a boot fact (pool absent, ECC)
# does not blink, so it is told at once and resolved only once it has stayed gone a minute.
HOLD_DOWN = MappingProxyType({
    "pool_absent": HoldDown(0.0, 60.0),
    "zero_coverage": HoldDown(60.0, 120.0),
    "churn_trap": HoldDown(30.0, 120.0),
    "vram_full": HoldDown(120.0, 300.0),
    "ecc_on": HoldDown(0.0, 60.0),
    "throttle_thermal": HoldDown(60.0, 120.0),
    "throttle_power": HoldDown(60.0, 120.0),
    "host_ram_low": HoldDown(30.0, 120.0),
    "trace_off": HoldDown(0.0, 120.0),  # the rule itself waits 90 s of traffic
    "decode_drift": HoldDown(0.0, 120.0),  # the drift reading has its own sustained window
})
DEFAULT_HOLD_DOWN = HoldDown(30.0, 60.0)


def hold_down(alert_id: str) -> HoldDown:
    return HOLD_DOWN.get(alert_id, DEFAULT_HOLD_DOWN)


RULES = (pool_absent, zero_coverage, churn_trap, vram_full, ecc_on, throttling, host_ram_low, trace_off, decode_drift)
ORDER = MappingProxyType({"critical": 0, "warning": 1, "info": 2})


def evaluate(inputs: AlertInputs) -> list[Alert]:
    out = [a for rule in RULES if (a := rule(inputs)) is not None]
    return sorted(out, key=lambda a: ORDER[a.severity])


def status_alerts(settings: Settings | None, snapshot: EngineSnapshot | None, log_lines: Iterable[LogLine | str],
                  gpus: list[GpuSample] | None = None) -> list[Alert]:
    """Alerts for `moet-panel engine status`, from the engine's recent log lines (and GPU samples).

    Without /metrics traffic figures, a READY engine whose logs contain no trace at all gets an
    `info` alert (idle engines print no tick lines, so this cannot be a warning).
    """
    trace = trace_of(log_lines)
    inputs = _inputs_for(settings, snapshot, trace, gpus or [])
    alerts = evaluate(inputs)
    if snapshot is not None and snapshot.state is EngineState.READY and trace.summaries == 0 and not trace.trace_on:
        alerts.append(Alert(
            "trace_unknown", "info", "No pool trace in the engine log",
            "No `moe_w2 delta trace ON` boot line and no `[delta] tick` summary: either the trace is off, or the "
            "engine has served nothing yet (summaries print only while tokens flow).",
            TRACE_HOW,
        ))
    return alerts


def trace_of(log_lines: Iterable[LogLine | str]) -> TraceSnapshot:
    """The pool trace of an engine run from its log lines: pass the run's whole log (`run_log_lines`), as the
    panel's telemetry sampler has followed it since boot, so a CLI and the header agree (issue 29)."""
    parser = TraceParser()
    for ln in log_lines:
        parser.feed_line(ln.text if isinstance(ln, LogLine) else str(ln), None)
    return parser.snapshot()


RUN_LOG_MAX_LINES = 200_000  # ~40 MB of text at most; a run's pool lines are a small share of it


def run_log_lines(runtime: Runtime | None, container_id: str, fallback: Iterable[LogLine]) -> list[str]:
    """The current run's log from its start, from the runtime (Docker keeps it); the in-memory tail only when
    the runtime cannot say. The tail alone loses the boot's `trace ON` line and the last `[delta] tick` under
    hours of health-check lines, and a fresh CLI process has no tail at all (issue 29)."""
    if runtime is not None and container_id:
        try:
            return [text for _, text in runtime.read_logs(container_id, max_lines=RUN_LOG_MAX_LINES)]
        except Exception as exc:  # gone meanwhile / daemon hiccup: the tail is the best left
            oplog.caught("telemetry", exc, "reading the run's whole log (the in-memory tail is used)")
    return [ln.text for ln in fallback]


def _inputs_for(settings: Settings | None, snapshot: EngineSnapshot | None, trace: TraceSnapshot, gpus: list[GpuSample]) -> AlertInputs:
    policy, ecc_off, ecc_note = "", False, ""
    if settings is not None:
        req = settings.recipe.requirements
        ecc_off = req.ecc == "off"
        ecc_note = req.ecc_note
        policy = profile_policy(settings, snapshot.profile_id if snapshot else None)
    return AlertInputs(trace=trace, gpus=gpus, engine=snapshot, policy=policy,
                       ecc_required_off=ecc_off, ecc_note=ecc_note)


def profile_policy(settings: Settings, profile_id: str | None) -> str:
    """VLLM_MOE_W2_DELTA_POLICY of the profile's effective command, custom profiles included (the base
    command's when the profile is unknown; '' when not set)."""
    try:
        profile = ProfileRegistry(settings).find(profile_id)
    except Exception as exc:  # an unreadable custom-profile folder: the recipe's own profiles still count
        oplog.caught("telemetry", exc, "finding the profile's pool policy (custom profiles unreadable)")
        profile = next((p for p in settings.recipe.profiles if p.id == profile_id), None)
    cmd = settings.recipe.command(profile) if profile is not None else settings.recipe.serve.command
    return cmd.env_value("VLLM_MOE_W2_DELTA_POLICY") or ""
