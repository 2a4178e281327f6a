"""SIMULATED FP4 delta tier: slot occupancy, promotions/evictions and the engine's `[delta]` trace lines.

A statistical stand-in for `moe_w2_delta.DeltaTier` (its trace format: docs/simengine.md): one manager tick per engine
step, lazy promotions of up to DELTA_PROMOTE per tick, hit-rates that grow with pool fill and saturate
near the card's ~57% of token->expert routings for a 7 GiB `freq` pool. Policies:
  freq            fills, then churns close to PROMOTE per tick
  freq + HYST>1   fills, then almost never displaces (window ~+0/-0)
  need (no gate)  never promotes: 0 coverage, no histogram
  need + gate     gate force-promotes in bursts, high churn, lower hit-rate
  lru (other)     fills, churns about half as much as freq
Invariant kept by construction: cached = cumulative promoted - cumulative evicted.
"""

from __future__ import annotations

import json
import math
import os
import random
from dataclasses import dataclass

from .config import SimEngineConfig
from .logsink import LogSink

N_LAYERS = 43
N_EXPERTS = 256
TOTAL_EXPERTS = N_LAYERS * N_EXPERTS  # 11008: the `covering C/11008` denominator
SLOT_MIB = 12.0  # DS4-Flash TP1 slot (w13 + w2 FP4 rows)
CARD_POOL_SLOTS = 597  # 7 GiB pool of the card's profiles
CARD_HIT_RATE = 0.57  # card: ~57% of all token->expert routings served at native precision
AUTO_FREE_AFTER_KV_GIB = 9.10  # what the simulated GPU has left after KV (DELTA_GB=auto)
SRC = "moe_w2_delta.py"


@dataclass(frozen=True)
class TierPlan:
    """What the tier looks like at boot (decided from the env knobs)."""

    exists: bool
    slots: int
    auto: bool
    disabled_auto: bool  # auto landed on 0 slots (pool_disabled)
    trace: int
    every: int
    dump: str
    policy: str
    hyst: float
    promote: int
    gate: bool
    store_dir: str


def plan_tier(cfg: SimEngineConfig) -> TierPlan:
    raw_gb = cfg.env_str("VLLM_MOE_W2_DELTA_GB", "2.0").lower()
    auto = raw_gb in ("auto", "-1", "-1.0")
    exists = cfg.env_str("VLLM_MOE_W2_DELTA", "1") != "0"
    slots = 0
    disabled = cfg.fail == "pool_disabled"
    if auto:
        slots = max(int((AUTO_FREE_AFTER_KV_GIB - 3.0) * 1024 / SLOT_MIB), 8)
    else:
        try:
            gb = float(raw_gb)
        except ValueError:
            gb = 2.0
        exists = exists and gb > 0
        slots = max(math.floor(gb * 1024 / SLOT_MIB), 8) if exists else 0
    if disabled:
        auto, slots = True, 0
    return TierPlan(
        exists=exists, slots=slots, auto=auto, disabled_auto=disabled,
        trace=cfg.env_int("VLLM_MOE_W2_DELTA_TRACE", 0), every=max(1, cfg.env_int("VLLM_MOE_W2_DELTA_TRACE_EVERY", 64)),
        dump=cfg.env_str("VLLM_MOE_W2_DELTA_DUMP"), policy=cfg.env_str("VLLM_MOE_W2_DELTA_POLICY", "freq").lower(),
        hyst=cfg.env_float("VLLM_MOE_W2_PROMO_HYST", 0.0), promote=max(1, cfg.env_int("VLLM_MOE_W2_DELTA_PROMOTE", 8)),
        gate=cfg.env_str("VLLM_MOE_W2_GATE", "0") == "1", store_dir=cfg.env_str("VLLM_MOE_W2_STORE_DIR"),
    )


class DeltaSim:
    """Tick-driven pool state; `on_step` is called by the engine core once per step."""

    def __init__(self, plan: TierPlan, log: LogSink, seed: int):
        self.plan = plan
        self._log = log
        self._rng = random.Random(seed * 7919 + 17)
        self.slots: list[tuple[int, int] | None] = [None] * plan.slots
        self._owned: set[tuple[int, int]] = set()
        self._layer_heat = [self._rng.uniform(0.7, 1.3) for _ in range(N_LAYERS)]
        self.tick = 0
        self.cum_p = self.cum_e = 0
        self._win_p = self._win_e = 0
        self._last_summary = 0
        self._hit_sum = 0.0
        self._hit_n = 0
        self.store_reads = 0
        self.last_hit_rate = 0.0

    @property
    def active(self) -> bool:
        return self.plan.exists and self.plan.slots > 0

    @property
    def cached(self) -> int:
        return len(self._owned)

    def _ceiling(self) -> float:
        """Saturated token hit-rate for this pool size and policy."""
        base = CARD_HIT_RATE * min(1.55, float((max(self.plan.slots, 1) / CARD_POOL_SLOTS) ** 0.4))
        if self.plan.policy == "need":
            return base * 0.55 if self.plan.gate else 0.0
        if self.plan.policy == "freq":
            return base * (0.96 if self.plan.hyst > 1.0 else 1.0)
        return base * 0.85

    def on_step(self, tokens: int) -> None:
        if not self.active:
            return
        self.tick += 1
        self._manage()
        fill = self.cached / self.plan.slots
        self._hit_sum += self._ceiling() * fill ** 2.5 * tokens
        self._hit_n += tokens
        if self.plan.trace >= 1 and self.tick - self._last_summary >= self.plan.every:
            self._summary()

    # --- promotions / evictions ------------------------------------------------------------------

    def _manage(self) -> None:
        p = self.plan
        free = p.slots - self.cached
        if p.policy == "need":
            if p.gate and self._rng.random() < 0.25:  # a gate fire force-promotes a burst
                self._churn(self._rng.randint(8, 64))
            return
        if free > 0:
            self._churn(min(p.promote, free))
            return
        if p.policy == "freq" and p.hyst > 1.0:
            n = 1 if self._rng.random() < 0.0015 else 0
        elif p.policy == "freq":
            n = p.promote if self._rng.random() < 0.93 else self._rng.randint(0, p.promote)
        else:
            n = self._rng.randint(0, p.promote)
        self._churn(n)

    def _churn(self, n: int) -> None:
        for _ in range(n):
            if self.cached >= TOTAL_EXPERTS and self.cached < self.plan.slots:
                return  # a pool larger than the model: everything is resident
            if self.cached >= self.plan.slots:
                self._evict()
            self._promote()

    def _pick_new(self) -> tuple[int, int]:
        for attempt in range(64):
            layer = self._rng.choices(range(N_LAYERS), weights=self._layer_heat)[0]
            spread = 64 if attempt < 16 else N_EXPERTS  # hot experts first, then anything free
            expert = min(N_EXPERTS - 1, int(self._rng.paretovariate(1.1)) - 1 + self._rng.randrange(0, spread))
            if (layer, expert) not in self._owned:
                return layer, expert
        return next((lay, e) for lay in range(N_LAYERS) for e in range(N_EXPERTS) if (lay, e) not in self._owned)

    def _promote(self) -> None:
        owner = self._pick_new()
        slot = self.slots.index(None)
        self.slots[slot] = owner
        self._owned.add(owner)
        self.cum_p += 1
        self._win_p += 1
        self.store_reads += 1
        if self.plan.trace >= 2:
            self._log.engine(f"{SRC}:1094", "[delta] promote L%-2d E%-3d  slot %-4d (tick %d)" % (*owner, slot, self.tick))

    def _evict(self) -> None:
        slot = self._rng.randrange(self.plan.slots)
        while self.slots[slot] is None:
            slot = (slot + 1) % self.plan.slots
        owner = self.slots[slot]
        assert owner is not None
        self.slots[slot] = None
        self._owned.discard(owner)
        self.cum_e += 1
        self._win_e += 1
        if self.plan.trace >= 2:
            self._log.engine(f"{SRC}:1037", "[delta] evict   L%-2d E%-3d  slot %-4d (cold %d ticks)"
                             % (*owner, slot, self._rng.randint(2, 40)))

    # --- summaries -------------------------------------------------------------------------------

    def _summary(self) -> None:
        hit = self._hit_sum / self._hit_n if self._hit_n else 0.0
        if hit > 0:
            hit = max(0.0, min(0.99, hit + self._rng.uniform(-0.012, 0.012)))
        exp_hit = hit * self._rng.uniform(0.6, 0.72)
        self.last_hit_rate = hit
        cached, slots = self.cached, self.plan.slots
        self._log.engine(
            f"{SRC}:1867",
            "[delta] tick %d: %d/%d slots, covering %d/%d experts (%.1f%%); hit-rate %.1f%% tokens / %.1f%% experts; "
            "window +%d/-%d, cumulative +%d/-%d"
            % (self.tick, cached, slots, cached, TOTAL_EXPERTS, 100.0 * cached / TOTAL_EXPERTS, 100 * hit,
               100 * exp_hit, self._win_p, self._win_e, self.cum_p, self.cum_e),
        )
        if cached:
            per_layer = [0] * N_LAYERS
            for layer, _ in self._owned:
                per_layer[layer] += 1
            pairs = " ".join(f"L{i}:{n}" for i, n in enumerate(per_layer) if n)
            self._log.engine(f"{SRC}:1876", f"[delta] experts per layer: {pairs}")
        if self.plan.store_dir:
            self._log.engine(f"{SRC}:1894", "[delta] pack store: %d row reads, %.2f GiB total"
                             % (self.store_reads, self.store_reads * SLOT_MIB / 1024))
        if self.plan.gate and self.plan.policy == "need" and self.cum_p:
            a, b, c = (self._rng.randint(3, 12), self._rng.randint(20, 35), self._rng.randint(40, 55))
            self._log.engine(f"{SRC}:1909", "[need] low-conf routing top1%%/5%%/10%% = %d/%d/%d  |  all routing "
                             "top1%%/5%%/10%% = %d/%d/%d  |  experts need>0: %d/%d"
                             % (a, b, c, a // 2, b // 2, c // 2, min(11264, self.cum_p), 44 * N_EXPERTS))
        if self.plan.dump:
            self._dump()
        self._win_p = self._win_e = 0
        self._hit_sum, self._hit_n = 0.0, 0
        self._last_summary = self.tick

    def _dump(self) -> None:
        """VLLM_MOE_W2_DELTA_DUMP: the precision map as one JSON line, tmp + rename (docs/simengine.md)."""
        by_layer: dict[str, list[int]] = {}
        for layer, expert in sorted(self._owned):
            by_layer.setdefault(str(layer), []).append(expert)
        doc = {"tick": self.tick, "n_slots": self.plan.slots, "cached": self.cached, "promoted_total": self.cum_p,
               "evicted_total": self.cum_e, "fp4_by_layer": by_layer}
        if self.plan.store_dir:
            doc["store"] = {"reads": self.store_reads, "read_bytes": int(self.store_reads * SLOT_MIB * 2**20),
                            "read_s": round(self.store_reads * 0.0047, 1)}
        tmp = self.plan.dump + ".tmp"
        try:
            with open(tmp, "w") as fh:
                json.dump(doc, fh)
            os.replace(tmp, self.plan.dump)
        except OSError as exc:
            self._log.engine(f"{SRC}:1936", f"delta dump to {self.plan.dump} failed: {exc}", "WARNING")
