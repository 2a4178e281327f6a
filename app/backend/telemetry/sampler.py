"""TelemetrySampler: the one background thread that samples GPU, host, pool trace and /metrics.

Everything the UI shows comes from `latest()` (an immutable `TelemetryFrame`) and the timeline;
page timers never trigger NVML or HTTP themselves, so N open tabs cost N dict reads, not N samples.

Engine log lines arrive through `engine.add_log_listener` on the engine's thread; the listener only
appends to a bounded queue and the hub thread parses them (the parser is single-threaded).

The engine's state comes from its change events, not from reading the controller each tick: one watch
(`engine.watch`, made when the engine is attached) keeps the snapshot, and a change wakes the hub thread,
which makes a new frame at once from the new state and the last GPU / host / metrics sample (alerts, the
state band). The GPU, host and /metrics are sampled on the tick only: they are readings, not events
(docs/engine.md, "Who listens").
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.backend.profiles.registry import ProfileRegistry
from app.backend.contracts import EngineFeed, EngineSnapshot, EngineState, EngineWatch, GpuReader, GpuSample, LogLine
from app.backend.config.settings import Settings
from app.backend import oplog
from app.backend.alerts import rules as alert_rules
from app.backend.alerts.rules import Alert, AlertInputs
from app.backend.telemetry.gpu import make_gpu_reader, tag_engine_processes
from app.backend.telemetry.gpu_sim import SimulatedGpuReader
from app.backend.telemetry.host import HostSample, HostSampler
from app.backend.telemetry.metrics import MetricsSample, MetricsScraper
from app.backend.telemetry.timeline import Timeline, TimelineDB, TimelinePoint
from app.backend.telemetry.trace import TraceParser, TraceSnapshot
from app.backend.contracts import GiB

if TYPE_CHECKING:
    from app.backend.selftest.drift import DriftReading, DriftWatch

PERSIST_EVERY = 10  # ticks between SQLite batches
POOL_IDLE_S = 10.0  # no tick line for this long = no steps = no churn (an idle engine prints no ticks)
LOG_QUEUE_MAX = 200_000
# An engine found already serving (the panel restarted, or another panel started it): the pool figures start
# from the last this many lines of each of its streams, read from the runtime, not blank (issue 29). Its
# access log alone writes 2 lines a second while the panel scrapes it.
SEED_LINES = 5000


@dataclass(frozen=True)
class GpuEngineFigures:
    """One GPU's engine on a box of several (docs/engine.md "Several GPUs"): its state, profile and decode speed
    (None while it does not serve), for the header's GPUs cell and the per-GPU plots."""

    gpu: int
    state: EngineState
    profile: str
    decode_tok_s: float | None = None


@dataclass(frozen=True)
class TelemetryFrame:
    """Everything sampled in one tick. Cheap to read; never mutated."""

    ts: float = 0.0
    seq: int = 0
    engine: EngineSnapshot | None = None
    gpus: tuple[GpuSample, ...] = ()
    gpu_error: str = ""
    gpu_simulated: bool = False
    host: HostSample | None = None
    trace: TraceSnapshot = field(default_factory=TraceSnapshot)
    metrics: MetricsSample | None = None
    alerts: tuple[Alert, ...] = ()
    per_gpu: tuple[GpuEngineFigures, ...] = ()  # every GPU's engine on a box of several; () on a one-GPU box

    @property
    def vram_used_gib(self) -> float | None:
        return sum(g.memory_in_use for g in self.gpus) / GiB if self.gpus else None

    @property
    def vram_total_gib(self) -> float | None:
        return sum(g.memory_total for g in self.gpus) / GiB if self.gpus else None

    @property
    def decode_tok_s(self) -> float | None:
        return self.metrics.decode_tok_s if self.metrics else None

    @property
    def coverage_pct(self) -> float | None:
        """Last measured coverage (it stays valid while the engine idles)."""
        return self.trace.coverage_pct

    @property
    def pool_idle_s(self) -> float | None:
        """Seconds since the last tick summary when that is ≥ POOL_IDLE_S, else None (pool active)."""
        last = self.trace.last_summary_ts
        if last is None or self.ts - last < POOL_IDLE_S:
            return None
        return self.ts - last

    @property
    def churn_per_s(self) -> float | None:
        return 0.0 if self.pool_idle_s is not None else self.trace.churn_per_s

    @property
    def h2d_gib_s(self) -> float | None:
        return 0.0 if self.pool_idle_s is not None and self.trace.h2d_gib_s is not None else self.trace.h2d_gib_s


class TelemetrySampler:
    """Owns the sampler thread. `sample_once()` runs one tick synchronously (tests, CLI)."""

    def __init__(
        self,
        settings: Settings | None = None,
        engine: EngineFeed | None = None,
        gpu_reader: GpuReader | None = None,
        interval_s: float = 1.0,
        persist: bool = True,
        capacity: int = 7200,
        scraper: MetricsScraper | None = None,
        host_sampler: HostSampler | None = None,
        engine_provider: Callable[[], EngineFeed | None] | None = None,
        sim_card: SimulatedGpuReader | None = None,
        more_engines: dict[int, Callable[[], EngineSnapshot]] | None = None,
        gpu: int = 0,
    ) -> None:
        """`more_engines`: on a box of several GPUs, the snapshot of every other GPU's engine (GPU -> snapshot);
        the hub scrapes each one's /metrics too, for the per-GPU decode figures. `gpu`: the attached engine's."""
        self.settings = settings
        self.interval_s = max(float(interval_s), 0.05)
        self.timeline = Timeline(capacity)
        self._engine: EngineFeed | None = None
        self._unsubscribe: Callable[[], None] | None = None
        self._watch: EngineWatch | None = None  # the engine's change events (attach_engine)
        self._engine_seen = -1  # the watch's seq the latest frame was made from
        self._wake = threading.Event()  # set by an engine change (in the writer: a flag only) and by close()
        self._last_drift: DriftReading | None = None  # the last tick's reading, kept by a frame between ticks
        self._engine_provider = engine_provider  # attach the engine once it exists
        self._reader = gpu_reader or make_gpu_reader(settings, self._engine_snapshot, self._engine_pids)
        # The SIMULATED card this hub feeds the decode load (`follow_engine` returns the app's; one made here,
        # following this hub's engine, is fed too). docs/telemetry.md
        self._sim_card = sim_card if gpu_reader is not None else (
            self._reader if isinstance(self._reader, SimulatedGpuReader) else None)
        self._scraper = scraper or MetricsScraper(timeout_s=min(1.0, self.interval_s))
        self._gpu = gpu
        self._more = dict(sorted((more_engines or {}).items()))
        # one scraper per other GPU's engine: each keeps its own previous scrape (rates are per engine)
        self._more_scrapers = {g: MetricsScraper(timeout_s=min(1.0, self.interval_s)) for g in self._more}
        self._host = host_sampler or HostSampler(settings.data_dir if settings is not None else None)
        self._parser = TraceParser()
        self._logq: deque[LogLine] = deque(maxlen=LOG_QUEUE_MAX)
        self._latest = TelemetryFrame()
        self.drift: DriftWatch | None = None  # set by build_app_state (the self-test's baseline)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._pending: list[TimelinePoint] = []
        self._last_state: EngineState | None = None
        self._last_summaries = 0
        self._traffic_no_tick_s = 0.0
        self._policies: dict[str | None, str] = {}
        self._boot_seen = ""  # the container whose boot this hub watched (its lines came live)
        self._seeded = ""  # the container whose log tail seeded the parser
        self.last_error = ""
        self._errors = oplog.Once("telemetry")  # the loop's errors: once each, not once a second
        self._db: TimelineDB | None = None
        if persist and settings is not None:
            try:
                self._db = TimelineDB(settings.ensure_state_dir() / "telemetry.sqlite")
            except Exception as exc:  # read-only data dir etc.: keep running in memory
                self.last_error = f"telemetry history disabled: {exc}"
                oplog.caught("telemetry", exc, "opening the telemetry history (kept in memory only)")
        if engine is not None:
            self.attach_engine(engine)

    # -- wiring ------------------------------------------------------------------------------
    @property
    def engine_gpus(self) -> list[int]:
        """The GPUs whose engines this hub follows: [the attached engine's] on a one-GPU box."""
        return sorted([self._gpu, *self._more])

    @property
    def gpu_reader(self) -> GpuReader:
        return self._reader

    def attach_engine(self, engine: EngineFeed) -> None:
        """Subscribe to the engine's changes and log lines (and replay its recent ones: boot sizing lines)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._watch is not None:
            self._watch.close()
        self._engine = engine
        self._watch = engine.watch(on_change=self._wake.set)
        self._engine_seen = -1
        try:
            for ln in engine.recent_logs(5000):
                self.ingest(ln)
        except Exception as exc:  # a replay that fails only loses the boot lines' pool sizing
            oplog.caught("telemetry", exc, "replaying the engine's recent log lines")
        self._unsubscribe = engine.add_log_listener(self.ingest)

    def ingest(self, line: LogLine | str) -> None:
        """Log listener: O(1), any thread."""
        self._logq.append(line if isinstance(line, LogLine) else LogLine(text=line))

    def _engine_snapshot(self) -> EngineSnapshot:
        return self._watch.snapshot if self._watch is not None else EngineSnapshot()

    def _engine_pids(self) -> set[int]:
        return set(self._engine.container_pids()) if self._engine is not None else set()

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="telemetry-hub", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._unsubscribe is not None:
            try:
                self._unsubscribe()
            except Exception as exc:  # closing goes on: the rest must still be released
                oplog.caught("telemetry", exc, "unsubscribing from the engine's log lines")
            self._unsubscribe = None
        if self._watch is not None:
            self._watch.close()
        self._flush_db()
        if self._db is not None:
            self._db.close()
            self._db = None
        self._scraper.close()
        for scraper in self._more_scrapers.values():
            scraper.close()
        self._reader.close()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_at:
                    self.sample_once()
                    next_at += self.interval_s
                    if next_at < time.monotonic():  # fell behind (slow NVML call): don't burst to catch up
                        next_at = time.monotonic()
                else:  # woken between ticks: an engine change (a frame now; the tick keeps its rhythm)
                    self.engine_changed()
            except Exception as exc:  # the thread must survive anything (a bug: with its traceback, once)
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._errors.caught(exc, "the telemetry loop", traceback=True)
            if self._wake.wait(max(0.0, next_at - time.monotonic())):
                self._wake.clear()  # before the work it asks for: a change during that work wakes us again

    # -- reading -----------------------------------------------------------------------------
    def latest(self) -> TelemetryFrame:
        return self._latest

    @property
    def alerts(self) -> tuple[Alert, ...]:
        return self._latest.alerts

    def series(self, window_s: float) -> list[TimelinePoint]:
        """Points of the last window_s seconds: memory when it covers the window, else SQLite."""
        since = time.time() - window_s
        pts = self.timeline.points(since)
        covers = len(self.timeline) < self.timeline.capacity or (pts and pts[0].ts <= since + 2 * self.interval_s)
        if covers or self._db is None:
            return pts
        self._flush_db()
        return self._db.query(since)

    # -- one tick ----------------------------------------------------------------------------
    def sample_once(self) -> TelemetryFrame:
        with self._lock:
            now = time.time()
            if self._engine is None and self._engine_provider is not None:
                engine = self._engine_provider()
                if engine is not None:
                    self.attach_engine(engine)
            snap = self._take_engine()
            self._track_engine(snap)
            self._seed_from_tail(snap)
            self._drain_logs()
            gpus, gpu_error = self._read_gpus(snap)
            host = self._host.sample()
            metrics = self._scrape(snap)
            per_gpu = self._scrape_more(snap, metrics)
            trace = self._parser.snapshot()
            self._track_traffic(metrics, trace)
            self._last_drift = (self.drift.update(now, snap.profile_id if snap else None,
                                                  metrics.decode_tok_s if metrics else None,
                                                  metrics.running if metrics else None)
                                if self.drift is not None and _live(snap) else None)
            alerts = self._alerts(snap, gpus, host, metrics, trace, self._last_drift)
            self._seq += 1
            frame = TelemetryFrame(now, self._seq, snap, tuple(gpus), gpu_error,
                                   self._reader.simulated, host, trace, metrics, tuple(alerts), per_gpu)
            self._latest = frame
            self._record(frame)
            return frame

    def engine_changed(self) -> TelemetryFrame | None:
        """A frame now for an engine change seen between two ticks (None: nothing changed since the last
        frame). The new state and alerts, with the last tick's GPU, host and /metrics readings (the latter only
        while the same run stays ready); a timeline point only when the state or profile moved (the band)."""
        with self._lock:
            if self._watch is None or self._watch.seq == self._engine_seen:
                return None
            prev = self._latest
            snap = self._take_engine()
            assert snap is not None
            self._track_engine(snap)
            self._seed_from_tail(snap)
            self._drain_logs()
            trace = self._parser.snapshot()
            before = prev.engine
            same_run = before is not None and before.container_id == snap.container_id
            metrics = prev.metrics if snap.is_ready and same_run else None
            drift = self._last_drift if _live(snap) else None
            alerts = self._alerts(snap, list(prev.gpus), prev.host, metrics, trace, drift)
            self._seq += 1
            per_gpu = tuple(replace(f, state=snap.state, profile=snap.profile_id or "",
                                    decode_tok_s=metrics.decode_tok_s if metrics else None)
                            if f.gpu == self._gpu else f for f in prev.per_gpu)
            frame = TelemetryFrame(time.time(), self._seq, snap, prev.gpus, prev.gpu_error, prev.gpu_simulated,
                                   prev.host, trace, metrics, tuple(alerts), per_gpu)
            self._latest = frame
            if before is None or (before.state, before.profile_id) != (snap.state, snap.profile_id):
                self._record(frame)
            return frame

    def _take_engine(self) -> EngineSnapshot | None:
        """The watched snapshot, noted as seen (None: no engine attached yet)."""
        if self._watch is None:
            return None
        self._engine_seen, snap = self._watch.current()
        return snap

    def _track_engine(self, snap: EngineSnapshot | None) -> None:
        state = snap.state if snap else None
        if state in (EngineState.PREFLIGHT, EngineState.STARTING) and self._last_state not in (
            EngineState.PREFLIGHT, EngineState.STARTING
        ):
            self._parser = TraceParser()  # a new boot: forget the previous run's pool
            self._last_summaries = 0
            self._traffic_no_tick_s = 0.0
            self._policies.clear()  # a (re)start may follow an edit of a custom profile
            self._scraper.reset()
        self._last_state = state

    def _seed_from_tail(self, snap: EngineSnapshot | None) -> None:
        """A run that was already serving when this hub first saw it: a fresh parser fed with its log tail
        (the controller hands on only the last few hundred lines it re-read when it adopted the run)."""
        cid = snap.container_id if snap else ""
        if not cid or snap is None:
            return
        if snap.state in (EngineState.PREFLIGHT, EngineState.STARTING):
            self._boot_seen = cid
        if cid in (self._boot_seen, self._seeded) or snap.state not in (EngineState.READY, EngineState.STALLED):
            return
        self._seeded = cid
        if self._engine is None:
            return
        self._logq.clear()  # lines queued so far are in the tail too
        try:
            lines = self._engine.log_tail(cid, SEED_LINES)
        except Exception as exc:  # Docker gone for a moment: the live lines still come
            self.last_error = f"log tail for the pool figures: {type(exc).__name__}: {exc}"
            self._errors.caught(exc, "reading the engine's log tail for the pool figures")
            return
        parser, now = TraceParser(), time.time()
        for _, text in lines:
            parser.feed_line(text, now)  # one burst: no rates from it (trace.RankState.rates), coverage at once
        self._parser = parser
        self._last_summaries = 0

    def _drain_logs(self) -> None:
        q = self._logq
        feed = self._parser.feed_line
        while q:
            ln = q.popleft()
            feed(ln.text, ln.ts)  # receipt time: finer than the line's 1 s stamp, good for rates

    def _read_gpus(self, snap: EngineSnapshot | None) -> tuple[list[GpuSample], str]:
        try:
            gpus = self._reader.read()
        except Exception as exc:
            self._errors.caught(exc, "reading the GPUs")
            return [], f"GPU read failed: {type(exc).__name__}: {exc}"
        if snap is not None and gpus:  # the readers return raw samples: the engine's processes are marked here
            try:
                gpus = tag_engine_processes(gpus, self._engine_pids(), snap.container_name)
            except Exception as exc:  # the engine's pids unknown now (runtime unreachable): the samples stay unmarked
                self._errors.caught(exc, "finding the engine's GPU processes")
        return gpus, ("" if self._reader.available else self._reader.error)

    def _scrape(self, snap: EngineSnapshot | None) -> MetricsSample | None:
        if snap is None or not snap.is_ready or not snap.base_url:
            return None
        sample = self._scraper.scrape(snap.base_url)
        self._feed_sim_card(snap, sample, self._gpu)
        return sample

    def _feed_sim_card(self, snap: EngineSnapshot, sample: MetricsSample, gpu: int) -> None:
        if self._sim_card is not None:
            expected = self._expected_decode(snap.profile_id) or 50.0
            self._sim_card.set_load((sample.decode_tok_s or 0.0) / expected, gpu)

    def _scrape_more(self, snap: EngineSnapshot | None, metrics: MetricsSample | None) -> tuple[GpuEngineFigures, ...]:
        """Every GPU's engine figures on a box of several (() on a one-GPU box): the attached engine's from this
        tick's scrape, each other GPU's engine's /metrics scraped here (an engine that does not serve: None)."""
        if not self._more:
            return ()
        own = snap or EngineSnapshot()
        out = {self._gpu: GpuEngineFigures(self._gpu, own.state, own.profile_id or "",
                                           metrics.decode_tok_s if metrics is not None else None)}
        for g, snapshot_fn in self._more.items():
            try:
                other = snapshot_fn()
            except Exception as exc:  # that GPU's figures are left blank this tick
                self._errors.caught(exc, f"reading GPU {g}'s engine snapshot")
                other = EngineSnapshot()
            decode = None
            if other.is_ready and other.base_url:
                sample = self._more_scrapers[g].scrape(other.base_url)
                self._feed_sim_card(other, sample, g)
                decode = sample.decode_tok_s
            out[g] = GpuEngineFigures(g, other.state, other.profile_id or "", decode)
        return tuple(out[g] for g in sorted(out))

    def _expected_decode(self, profile_id: str | None) -> float | None:
        if self.settings is None:
            return None
        p = ProfileRegistry(self.settings).find(profile_id)  # custom profiles too (they carry no figure: None)
        return float(p.decode.value) if p is not None and p.decode is not None else None

    def _track_traffic(self, metrics: MetricsSample | None, trace: TraceSnapshot) -> None:
        if trace.summaries != self._last_summaries:
            self._last_summaries = trace.summaries
            self._traffic_no_tick_s = 0.0
        elif metrics is not None and (metrics.decode_tok_s or 0) > 0:
            self._traffic_no_tick_s += self.interval_s

    def _alerts(self, snap: EngineSnapshot | None, gpus: list[GpuSample], host: HostSample | None,
                metrics: MetricsSample | None, trace: TraceSnapshot, drift: DriftReading | None) -> list[Alert]:
        live = _live(snap)
        s = self.settings
        req = s.recipe.requirements if s is not None else None
        inputs = AlertInputs(
            trace=trace if live else None,
            gpus=gpus,
            host=host,
            metrics=metrics,
            engine=snap,
            traffic_seen_s=self._traffic_no_tick_s if metrics is not None else None,
            policy=self._policy(snap.profile_id if snap else None),
            ecc_required_off=req is not None and req.ecc == "off",
            ecc_note=req.ecc_note if req is not None else "",
            drift=drift,
        )
        return alert_rules.evaluate(inputs)

    def _policy(self, profile_id: str | None) -> str:
        """DELTA_POLICY of the active profile, cached per profile (custom profiles live on disk)."""
        if self.settings is None:
            return ""
        if profile_id not in self._policies:
            self._policies[profile_id] = alert_rules.profile_policy(self.settings, profile_id)
        return self._policies[profile_id]

    def _record(self, f: TelemetryFrame) -> None:
        point = point_from_frame(f)
        self.timeline.append(point)
        if self._db is None:
            return
        self._pending.append(point)
        if len(self._pending) >= PERSIST_EVERY:
            self._flush_db()

    def _flush_db(self) -> None:
        if self._db is None or not self._pending:
            return
        batch, self._pending = self._pending, []
        try:
            self._db.insert(batch)
        except Exception as exc:
            self.last_error = f"telemetry history write failed: {exc}"
            self._errors.caught(exc, "writing the telemetry history")


def _live(snap: EngineSnapshot | None) -> bool:
    """The engine's pool figures and decode speed mean something (no engine attached: a bare hub, CLI)."""
    return snap is None or snap.state in (EngineState.STARTING, EngineState.READY)


def point_from_frame(f: TelemetryFrame) -> TimelinePoint:
    g0 = f.gpus[0] if f.gpus else None
    t = f.trace
    p = t.primary
    m = f.metrics
    last = p.last if p else None
    return TimelinePoint(
        ts=f.ts,
        profile=(f.engine.profile_id or "") if f.engine else "",
        engine_state=f.engine.state.value if f.engine else "",
        vram_used_gib=f.vram_used_gib,
        vram_total_gib=f.vram_total_gib,
        gpu_util=g0.util_gpu if g0 else None,
        power_w=g0.power_w if g0 else None,
        temp_c=g0.temperature_c if g0 else None,
        coverage_pct=t.coverage_pct,
        expert_hit_pct=t.expert_hit_pct,
        experts_resident=float(last.covered) if last else None,
        pool_fill=float(last.cached) if last else None,
        pool_slots=float(last.slots) if last else None,
        churn_per_s=f.churn_per_s,
        h2d_gib_s=f.h2d_gib_s,
        decode_tok_s=m.decode_tok_s if m else None,
        prompt_tok_s=m.prompt_tok_s if m else None,
        ttft_p50_s=m.ttft_p50_s if m else None,
        itl_p50_s=m.itl_p50_s if m else None,
        kv_usage_pct=m.kv_usage_pct if m else None,
        running=m.running if m else None,
        waiting=m.waiting if m else None,
        cpu_pct=f.host.cpu_pct if f.host else None,
        ram_used_pct=f.host.ram_used_pct if f.host else None,
        per_gpu=_per_gpu_json(f),
    )


def _per_gpu_json(f: TelemetryFrame) -> str:
    """The timeline's per-GPU figures (TimelinePoint.per_gpu): each engine's GPU, its VRAM as nvidia-smi shows
    it, utilisation and decode speed; "" on a one-GPU box."""
    if not f.per_gpu:
        return ""
    cards = {g.index: g for g in f.gpus}
    out = []
    for e in f.per_gpu:
        g = cards.get(e.gpu)
        vram = round(g.memory_in_use / GiB, 3) if g is not None else None
        util = g.util_gpu if g is not None else None
        out.append([e.gpu, vram, util, None if e.decode_tok_s is None else round(e.decode_tok_s, 2)])
    return json.dumps(out, separators=(",", ":"))
