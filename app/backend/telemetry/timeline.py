"""One time axis for every series: an in-memory ring buffer (bounded) plus optional SQLite history.

A `TimelinePoint` is one sampler tick (GPU, host, pool, engine metrics), tagged with the active
profile. The ring holds `capacity` points (default 2 h at 1 Hz, ~1 KB each); SQLite
(`<state_dir>/telemetry.sqlite`) keeps `retention_s` of history for longer windows.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from app.backend.files.modes import create_private


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    ts: float
    profile: str = ""
    engine_state: str = ""
    vram_used_gib: float | None = None
    vram_total_gib: float | None = None
    gpu_util: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    coverage_pct: float | None = None  # the card's pool coverage: token hit-rate
    expert_hit_pct: float | None = None
    experts_resident: float | None = None
    pool_fill: float | None = None  # filled slots
    pool_slots: float | None = None
    churn_per_s: float | None = None
    h2d_gib_s: float | None = None
    decode_tok_s: float | None = None
    prompt_tok_s: float | None = None
    ttft_p50_s: float | None = None
    itl_p50_s: float | None = None
    kv_usage_pct: float | None = None
    running: float | None = None
    waiting: float | None = None
    cpu_pct: float | None = None
    ram_used_pct: float | None = None
    # a box of several GPUs (docs/telemetry.md "Several GPUs"): JSON [[gpu, VRAM used GiB, util %, decode tok/s],
    # ...], one entry per GPU; "" on a one-GPU box (its figures are the fields above). Text: SQLite keeps it as is.
    per_gpu: str = ""


FIELDS = tuple(f.name for f in fields(TimelinePoint))
TEXT_FIELDS = frozenset({"profile", "engine_state", "per_gpu"})


class Timeline:
    """Thread-safe ring buffer of TimelinePoints, oldest first."""

    def __init__(self, capacity: int = 7200) -> None:
        self._ring: deque[TimelinePoint] = deque(maxlen=max(capacity, 1))
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        return self._ring.maxlen or 0

    def append(self, point: TimelinePoint) -> None:
        with self._lock:
            self._ring.append(point)

    def __len__(self) -> int:
        return len(self._ring)

    def points(self, since: float | None = None) -> list[TimelinePoint]:
        with self._lock:
            pts = list(self._ring)
        if since is None:
            return pts
        # points are appended in time order: skip from the left
        i = 0
        while i < len(pts) and pts[i].ts < since:
            i += 1
        return pts[i:]

    def latest(self) -> TimelinePoint | None:
        with self._lock:
            return self._ring[-1] if self._ring else None


class TimelineDB:
    """SQLite history; one connection guarded by a lock (written by the hub, read by the UI)."""

    def __init__(self, path: str | Path, retention_s: float = 7 * 86400) -> None:
        self.path = Path(path)
        create_private(self.path)
        self._retention = retention_s
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        cols = ", ".join(f"{n} {_sql_type(n)}" for n in FIELDS)
        with self._lock, self._db:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"CREATE TABLE IF NOT EXISTS points ({cols})")
            self._db.execute("CREATE INDEX IF NOT EXISTS points_ts ON points(ts)")
            # a history written by an older panel lacks the newer columns: add them (old rows read as empty)
            have = {row[1] for row in self._db.execute("PRAGMA table_info(points)")}
            for n in FIELDS:
                if n not in have:
                    self._db.execute(f"ALTER TABLE points ADD COLUMN {n} {_sql_type(n)}")

    def insert(self, points: list[TimelinePoint]) -> None:
        if not points:
            return
        marks = ", ".join("?" for _ in FIELDS)
        rows = [tuple(getattr(p, n) for n in FIELDS) for p in points]
        with self._lock, self._db:
            self._db.executemany(f"INSERT INTO points ({', '.join(FIELDS)}) VALUES ({marks})", rows)
            self._db.execute("DELETE FROM points WHERE ts < ?", (time.time() - self._retention,))

    def query(self, since: float, until: float | None = None, max_points: int = 2000) -> list[TimelinePoint]:
        """Points in [since, until], thinned evenly to at most max_points."""
        until = until if until is not None else time.time() + 1
        with self._lock:
            rows = self._db.execute(
                f"SELECT {', '.join(FIELDS)} FROM points WHERE ts >= ? AND ts <= ? ORDER BY ts", (since, until)
            ).fetchall()
        step = max(1, len(rows) // max_points + (1 if len(rows) % max_points else 0)) if len(rows) > max_points else 1
        # a row written before a column was added reads None there: the text fields' empty value instead
        return [_point(r) for r in rows[::step]]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _sql_type(name: str) -> str:
    return "TEXT" if name in TEXT_FIELDS else "REAL"


def _point(row: tuple[Any, ...]) -> TimelinePoint:
    """A row as a point; a row written before a column was added reads None there: a text field's "" instead."""
    values: dict[str, Any] = {n: ("" if v is None and n in TEXT_FIELDS else v) for n, v in zip(FIELDS, row, strict=True)}
    return TimelinePoint(**values)
