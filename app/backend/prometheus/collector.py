"""The `moet_panel_*` families, built at scrape time from what the services already hold (docs/metrics.md).

A scrape reads only cached state: the telemetry hub's last frame, the engine controller's snapshot,
the download board's counters, the panel's counters, and the self-test results (re-read only when the
results directory changes). No NVML, Docker or engine call happens inside a scrape, so a scrape costs
what building a few hundred lines of text costs (bench/metrics_scrape.py).

Naming (Prometheus' conventions): `moet_panel_` prefix, base units as suffixes (`_bytes`, `_seconds`,
`_celsius`, `_watts`, `_ratio`), `_total` on counters. Labels join with vLLM's (`model_name`, the served
name) and DCGM exporter's (`gpu`, `UUID`) where they name the same thing. vLLM's own
`vllm:*` series are never re-exported: operators scrape the engine on loopback (docs/metrics.md).
Series from a simulated source (demo mode's engine, GPU, Hub, self-test) carry `simulated="1"`.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from app.backend.contracts import LIVE_STATES, EngineSnapshot, EngineState
from app.backend.alerts import rules as alert_rules
from app.backend.contracts import GiB

if TYPE_CHECKING:
    from app.backend.state import AppState
    from app.backend.telemetry.sampler import TelemetryFrame

# Every alert id the panel raises (app/backend/alerts/rules.py), exported 0/1 so a dashboard shows
# the quiet ones too; an id added later still appears while it fires.
KNOWN_ALERTS = ("pool_absent", "zero_coverage", "churn_trap", "vram_full", "ecc_on", "throttle_thermal",
                "throttle_power", "host_ram_low", "trace_off", "decode_drift")
# The operator's log components (app/backend/oplog/__init__.py), exported at 0 too so a rate() has a series from the start.
ERROR_COMPONENTS = ("engine", "gateway", "service", "downloads", "telemetry", "selftest", "abtest", "chat", "auth",
                    "panel")
# NVML's decoded clock-event reasons (app/backend/telemetry/nvml.py THROTTLE_BITS), exported 0/1.
THROTTLE_REASONS = ("gpu_idle", "applications_clocks", "sw_power_cap", "hw_slowdown", "sync_boost", "sw_thermal",
                    "hw_thermal", "hw_power_brake", "display_clocks")
assert alert_rules.THERMAL | alert_rules.POWER <= set(THROTTLE_REASONS)


def _version() -> str:
    try:
        return importlib.metadata.version("moet-panel")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree without an install
        return "unknown"


VERSION = _version()
PYTHON = ".".join(map(str, sys.version_info[:3]))


@dataclass(frozen=True)
class CanaryReading:
    """The generation canary's last judged verdict, from the engine snapshot (docs/engine.md, "Liveness")."""

    ok: bool
    last_timestamp_s: float
    latency_s: float | None
    failures_total: int


@dataclass(frozen=True)
class EngineExtras:
    restarts_total: int
    switches: dict[str, int]  # by result: ok, rolled_back, failed, cancelled
    canary: CanaryReading | None


def engine_extras(snap: EngineSnapshot) -> EngineExtras:
    """Restarts, switches by result and the canary: all from the controller's snapshot, the one source of
    truth (docs/engine.md, "events out"). The canary series are absent until a canary was judged."""
    canary = None if snap.canary_ok is None else CanaryReading(snap.canary_ok, snap.canary_at, snap.canary_latency_s,
                                                              snap.canary_failures_total)
    switches = {"ok": snap.switches_ok, "rolled_back": snap.switches_rolled_back, "failed": snap.switches_failed,
                "cancelled": snap.switches_cancelled}
    return EngineExtras(restarts_total=snap.restarts_total, switches=switches, canary=canary)


class _Families:
    """Families in first-use order; each sample's labels are free-form (the simulated label comes and goes)."""

    def __init__(self) -> None:
        self._fams: dict[str, Metric] = {}

    def _fam(self, name: str, doc: str, typ: str) -> Metric:
        fam = self._fams.get(name)
        if fam is None:
            fam = self._fams[name] = Metric(name, doc, typ)
        return fam

    def gauge(self, name: str, doc: str, value: float | None, labels: dict[str, str] | None = None,
              simulated: bool = False) -> None:
        if value is None:
            return
        fam = self._fam(name, doc, "gauge")
        fam.add_sample(name, _labels(labels, simulated), float(value))

    def counter(self, name: str, doc: str, value: float | None, labels: dict[str, str] | None = None,
                simulated: bool = False) -> None:
        """`name` without `_total`; the sample is `<name>_total`."""
        if value is None:
            return
        fam = self._fam(name, doc, "counter")
        fam.add_sample(name + "_total", _labels(labels, simulated), float(value))

    def families(self) -> Iterator[Metric]:
        return iter(self._fams.values())


def _labels(labels: dict[str, str] | None, simulated: bool) -> dict[str, str]:
    out = dict(labels or {})
    if simulated:
        out["simulated"] = "1"
    return out


class SelfTestFigures:
    """The latest self-test decode median per profile, re-read only when the results directory changes
    (a save is an atomic rename into it, which changes the directory's mtime)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._stamp: int | None = None
        self._figures: dict[str, tuple[float, float, bool]] = {}  # profile -> (tok/s, run timestamp, simulated)

    def figures(self) -> dict[str, tuple[float, float, bool]]:
        try:
            stamp = self.root.stat().st_mtime_ns
        except OSError:
            return {}
        if stamp != self._stamp:
            self._figures, self._stamp = self._read(), stamp
        return self._figures

    def _read(self) -> dict[str, tuple[float, float, bool]]:
        from datetime import datetime

        from app.backend.selftest.store import ResultsStore

        out: dict[str, tuple[float, float, bool]] = {}
        for r in ResultsStore(self.root.parent).all():  # newest first
            if r.profile_id in out or not r.decode:
                continue
            try:
                when = datetime.fromisoformat(r.date).timestamp()
            except ValueError:
                when = 0.0
            out[r.profile_id] = (statistics.median(d.tok_s for d in r.decode), when, r.simulated)
        return out


class PanelCollector(Collector):
    """A prometheus_client collector over one AppState (registered in a registry of its own)."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        st = state.selftest
        self._selftest = SelfTestFigures(st.store.root if st is not None else state.settings.state_dir / "selftest")

    def describe(self) -> list[Metric]:
        return []  # built at scrape time; nothing to describe ahead of it

    def collect(self) -> Iterator[Metric]:
        b = _Families()
        s = self.state
        settings = s.settings
        model = settings.recipe.model.served_name
        b.gauge("moet_panel_build_info", "moet-panel's version, recipe and mode (always 1).", 1,
                {"version": VERSION, "python": PYTHON, "recipe": settings.recipe.id,
                 "mode": "demo" if settings.demo else "real"})
        frame = s.telemetry.latest() if s.telemetry is not None else None
        snap = s.engine.snapshot() if s.engine is not None else None
        if snap is not None:
            self._engine(b, snap, model)
        if frame is not None and frame.seq:
            self._telemetry(b, frame, snap, model)
        self._card_and_selftest(b, model)
        self._downloads(b)
        self._panel(b)
        if s.gateway is None:
            return b.families()
        # the gateway process's figures, as it last reported them (docs/metrics.md "The gateway")
        from app.backend.gateway.gwmetrics import families as gateway_families

        data, up = s.gateway.metrics()
        return itertools.chain(b.families(), gateway_families(data, up))

    # -- engine -----------------------------------------------------------------------------------
    def _engine(self, b: _Families, snap: EngineSnapshot, model: str) -> None:
        sim = snap.simulated
        m = {"model_name": model}
        b.gauge("moet_panel_engine_ready", "1 when the engine serves (state ready), else 0.", int(snap.is_ready), m, sim)
        for st in EngineState:
            b.gauge("moet_panel_engine_state", "1 for the engine's current lifecycle state, 0 for the others "
                    "(docs/engine.md).", int(snap.state is st), {**m, "state": st.value}, sim)
        b.gauge("moet_panel_engine_state_changed_timestamp_seconds", "When the engine entered its current state "
                "(Unix time).", snap.since, m, sim)
        if snap.profile_id and snap.state in LIVE_STATES:
            b.gauge("moet_panel_engine_profile_info", "The profile the engine runs (always 1; join on profile).", 1,
                    {**m, "profile": snap.profile_id}, sim)
        extras = engine_extras(snap)
        b.counter("moet_panel_engine_restarts", "Engine restarts the panel's supervisor made (crash, stall, reboot "
                  "recovery; docs/engine.md, \"Keeps serving\").", extras.restarts_total, m, sim)
        switches = extras.switches
        for result in ("ok", "rolled_back", "failed", "cancelled"):
            b.counter("moet_panel_profile_switches", "Profile switches finished, by result (rolled_back: the new "
                      "profile failed and the previous one serves again).", switches.get(result, 0),
                      {**m, "result": result}, sim)
        c = extras.canary
        if c is not None:
            b.gauge("moet_panel_engine_canary_ok", "1 when the last generation canary produced tokens.", int(c.ok), m, sim)
            b.gauge("moet_panel_engine_canary_last_timestamp_seconds", "When the last canary ran (Unix time).",
                    c.last_timestamp_s, m, sim)
            b.gauge("moet_panel_engine_canary_latency_seconds", "The last canary's duration.", c.latency_s, m, sim)
            b.counter("moet_panel_engine_canary_failures", "Canaries that produced no token.", c.failures_total, m, sim)

    # -- telemetry hub's frame -------------------------------------------------------------------
    def _telemetry(self, b: _Families, f: TelemetryFrame, snap: EngineSnapshot | None, model: str) -> None:
        b.gauge("moet_panel_telemetry_last_sample_timestamp_seconds", "When the telemetry hub last sampled "
                "(Unix time; it samples once a second).", f.ts)
        for g in f.gpus:
            sim = g.simulated or f.gpu_simulated
            lab = {"gpu": str(g.index), "UUID": g.uuid}
            b.gauge("moet_panel_gpu_memory_used_bytes", "GPU memory in use (NVML v2 used, what "
                    "nvidia-smi shows; the driver's reserve apart).", g.memory_in_use, lab, sim)
            b.gauge("moet_panel_gpu_memory_reserved_bytes", "GPU memory the driver reserves (not part of used).",
                    g.memory_reserved, lab, sim)
            b.gauge("moet_panel_gpu_memory_total_bytes", "GPU memory in total.", g.memory_total, lab, sim)
            b.gauge("moet_panel_gpu_utilization_ratio", "GPU utilisation, 0-1.",
                    g.util_gpu / 100.0 if g.util_gpu is not None else None, lab, sim)
            b.gauge("moet_panel_gpu_temperature_celsius", "GPU temperature.", g.temperature_c, lab, sim)
            b.gauge("moet_panel_gpu_power_watts", "GPU power draw.", g.power_w, lab, sim)
            b.gauge("moet_panel_gpu_power_limit_watts", "GPU power limit.", g.power_limit_w, lab, sim)
            b.gauge("moet_panel_gpu_ecc_enabled", "1 when ECC is on (the recipe wants it off).",
                    int(g.ecc_current) if g.ecc_current is not None else None, lab, sim)
            active = set(g.throttle_reasons)
            for reason in (*THROTTLE_REASONS, *sorted(active - set(THROTTLE_REASONS))):
                b.gauge("moet_panel_gpu_throttled", "1 while NVML reports this clock-event (throttle) reason.",
                        int(reason in active), {**lab, "reason": reason}, sim)
        if f.host is not None:
            h = f.host
            b.gauge("moet_panel_host_memory_available_bytes", "Host RAM available.", h.ram_available or None)
            b.gauge("moet_panel_host_memory_total_bytes", "Host RAM in total.", h.ram_total or None)
            disk = {"disk": "data_dir"}  # a name, never the path: labels must not show where the data lives
            b.gauge("moet_panel_disk_free_bytes", "Free space on the data dir's disk.", h.disk_free, disk)
            b.gauge("moet_panel_disk_total_bytes", "Size of the data dir's disk.", h.disk_total, disk)
        if snap is not None and snap.state in LIVE_STATES:
            self._pool(b, f, model, snap.simulated)
        firing = {a.id for a in f.alerts}
        for alert_id in (*KNOWN_ALERTS, *sorted(firing - set(KNOWN_ALERTS))):
            b.gauge("moet_panel_alerts_firing", "1 while the panel's own alert of this id is raised "
                    "(docs/telemetry.md#alerts).", int(alert_id in firing), {"alert": alert_id})

    def _pool(self, b: _Families, f: TelemetryFrame, model: str, sim: bool) -> None:
        t = f.trace
        m = {"model_name": model}
        p = t.primary
        last = p.last if p is not None else None
        slots = last.slots if last is not None else (t.sizing.slots if t.sizing is not None else None)
        b.gauge("moet_panel_pool_disabled", "1 when the engine runs without the FP4 recovery pool (0 slots).",
                int(t.pool_disabled), m, sim)
        b.gauge("moet_panel_pool_coverage_ratio", "Share of token→expert routings served at FP4 (the card's ~57%).",
                t.coverage_pct / 100.0 if t.coverage_pct is not None else None, m, sim)
        b.gauge("moet_panel_pool_expert_hit_ratio", "Share of expert lookups that hit the pool.",
                t.expert_hit_pct / 100.0 if t.expert_hit_pct is not None else None, m, sim)
        b.gauge("moet_panel_pool_slots", "Slots in the FP4 pool.", slots, m, sim)
        if last is not None:
            b.gauge("moet_panel_pool_slots_filled", "Slots holding an expert.", last.cached, m, sim)
            b.gauge("moet_panel_pool_experts_resident", "Experts resident at FP4.", last.covered, m, sim)
            b.gauge("moet_panel_pool_experts", "Experts in the model (all layers).", last.total, m, sim)
            b.counter("moet_panel_pool_promotions", "Experts promoted into the pool (the engine's cumulative count, "
                      "all ranks; resets with the engine).", sum(r.last.cum_promoted for r in t.ranks if r.last), m, sim)
            b.counter("moet_panel_pool_evictions", "Experts evicted from the pool (cumulative, all ranks).",
                      sum(r.last.cum_evicted for r in t.ranks if r.last), m, sim)
        idle = f.pool_idle_s is not None
        b.gauge("moet_panel_pool_churn_slots_per_second", "Promotions + evictions per second (0 while idle).",
                f.churn_per_s, m, sim)
        rep = p.replacements_per_s if p is not None else None
        b.gauge("moet_panel_pool_replacements_per_second", "Slots swapped per second (min of promotions and "
                "evictions: filling a half-empty pool is not churn; 0 while idle).",
                0.0 if idle and rep is not None else rep, m, sim)
        b.gauge("moet_panel_pool_host_to_device_bytes_per_second", "Estimated promotion traffic host→device "
                "(promotions/s × slot size, all ranks).", f.h2d_gib_s * GiB if f.h2d_gib_s is not None else None, m, sim)
        b.gauge("moet_panel_pool_slot_bytes", "Size of one pool slot.", p.slot_bytes if p is not None else None, m, sim)
        b.counter("moet_panel_pool_trace_summaries", "`[delta] tick` summary lines read since the engine booted.",
                  t.summaries, m, sim)

    # -- card and self-test ------------------------------------------------------------------------
    def _card_and_selftest(self, b: _Families, model: str) -> None:
        recipe = self.state.settings.recipe
        for p in recipe.profiles:
            if p.decode is not None:
                b.gauge("moet_panel_card_decode_tokens_per_second", "The card's single-stream decode figure for the "
                        "profile (the recipe).", p.decode.value, {"model_name": model, "profile": p.id})
        b.gauge("moet_panel_card_vram_bytes", "The card's VRAM in use at 256K context (the recipe's vram.expected_gib).",
                recipe.vram.expected_gib * GiB, {"model_name": model})
        for profile, (tok_s, when, sim) in sorted(self._selftest.figures().items()):
            lab = {"model_name": model, "profile": profile}
            b.gauge("moet_panel_selftest_decode_tokens_per_second", "This box's latest self-test decode (median of its "
                    "runs) for the profile, beside moet_panel_card_decode_tokens_per_second.", tok_s, lab, sim)
            b.gauge("moet_panel_selftest_last_run_timestamp_seconds", "When that self-test ran (Unix time).",
                    when, lab, sim)

    # -- downloads --------------------------------------------------------------------------------
    def _downloads(self, b: _Families) -> None:
        d = self.state.downloads
        if d is None:
            return
        from app.backend.download.types import ArtifactState

        sim = d.simulated
        counts = {c.id: c for c in d.counters()}
        remaining = 0
        for a in self.state.settings.recipe.artifacts:
            c = counts.get(a.id)
            lab = {"artifact": a.id}
            done = c is not None and c.state is ArtifactState.DONE
            if not done:
                remaining += int(a.extracted_gib * GiB)
            b.gauge("moet_panel_download_complete", "1 when the artifact is downloaded, verified and extracted.",
                    int(done), lab, sim)
            if c is None:
                continue
            b.counter("moet_panel_download_received_bytes", "Bytes received for the artifact by this panel process "
                      "(retries included).", c.received_bytes, lab, sim)
            b.gauge("moet_panel_download_verified_parts", "Parts whose sha256 matched.", c.parts_verified, lab, sim)
            b.gauge("moet_panel_download_parts", "Parts of the artifact (0 until listed).", c.parts_total, lab, sim)
            b.gauge("moet_panel_download_size_bytes", "Compressed size of the artifact (0 until listed).",
                    c.size_bytes, lab, sim)
            b.counter("moet_panel_download_verify_failures", "Parts that failed sha256 (fetched again) in this panel "
                      "process.", c.verify_failures, lab, sim)
        b.gauge("moet_panel_download_remaining_extracted_bytes", "Disk the artifacts not yet complete take once "
                "extracted (the recipe's sizes).", remaining, None, sim)
        b.gauge("moet_panel_download_running", "1 while a download runs.", int(d.running), None, sim)

    # -- the panel itself ---------------------------------------------------------------------------
    def _panel(self, b: _Families) -> None:
        c = self.state.counters
        from app.backend import oplog

        errors = oplog.error_counts()
        for component in (*ERROR_COMPONENTS, *sorted(set(errors) - set(ERROR_COMPONENTS))):
            b.counter("moet_panel_errors", "Errors the panel caught and handled, by component (each is one line "
                      "in the operator's log, docs/engine.md#the-operators-log).", errors.get(component, 0),
                      {"component": component})
        logins = c.login_failures()
        for reason in ("bad_credentials", "locked_out"):
            b.counter("moet_panel_login_failures", "Failed sign-ins (locked_out: refused by the throttle unchecked).",
                      logins.get(reason, 0), {"reason": reason})
        from app.backend.prometheus.counters import REFUSAL_REASONS

        refusals = c.refusals()
        for reason in (*REFUSAL_REASONS.values(), "other"):
            b.counter("moet_panel_http_refusals", "Requests the panel's HTTP gate refused, by reason (host: Host "
                      "not allowed; origin: another site's page; docs/ui-and-safety.md#the-http-gate).",
                      refusals.get(reason, 0), {"reason": reason})
        denied = c.metrics_denials()
        for reason in ("no_token", "bad_token", "no_token_file"):
            b.counter("moet_panel_metrics_denied", "/metrics requests refused for want of the bearer token.",
                      denied.get(reason, 0), {"reason": reason})
