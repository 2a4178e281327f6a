"""Self-test plan and result types (plain dataclasses: they are stored as JSON)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from app.backend.contracts import JsonObject


@dataclass(frozen=True)
class SelfTestPlan:
    profile_id: str
    runs: int = 3
    decode_tokens: int = 2000  # the issue: a long answer, min_tokens/ignore_eos so it cannot stop early
    ttft_lengths: tuple[int, ...] = (1024, 8192, 32768)
    needle_lengths: tuple[int, ...] = (65536, 262144)
    needle_answer_tokens: int = 48

    def __post_init__(self) -> None:
        if not 1 <= self.runs <= 20:
            raise ValueError(f"runs must be 1..20, got {self.runs}")
        if not 16 <= self.decode_tokens <= 32768:
            raise ValueError(f"decode tokens must be 16..32768, got {self.decode_tokens}")

    def to_dict(self) -> dict[str, object]:
        """What a result stores of its plan (SelfTestResult.plan)."""
        return {"runs": self.runs, "decode_tokens": self.decode_tokens, "ttft_lengths": list(self.ttft_lengths),
                "needle_lengths": list(self.needle_lengths)}

    @classmethod
    def from_dict(cls, profile_id: str, d: Mapping[str, object]) -> "SelfTestPlan":
        """The plan of a stored result, to run the same test again (missing keys: the defaults).
        TypeError / ValueError: a value of the wrong kind."""
        base = cls(profile_id)
        return cls(profile_id, runs=_int(d.get("runs", base.runs)), decode_tokens=_int(d.get("decode_tokens", base.decode_tokens)),
                   ttft_lengths=_ints(d.get("ttft_lengths", base.ttft_lengths)),
                   needle_lengths=_ints(d.get("needle_lengths", base.needle_lengths)))


@dataclass(frozen=True)
class DecodeRun:
    tok_s: float
    tokens: int
    ttft_s: float
    metrics_tok_s: float | None  # the same run from /metrics' generation_tokens_total, for the cross-check


@dataclass(frozen=True)
class TtftPoint:
    prompt_tokens: int
    ttft_s: float

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.ttft_s if self.ttft_s > 0 else 0.0


@dataclass(frozen=True)
class NeedleOutcome:
    length: int
    depth: float
    prompt_tokens: int
    code: str
    found: bool
    answer: str
    skipped: str = ""  # why it was not run (past --max-model-len)


@dataclass
class TelemetrySummary:
    """What the box did during the run (NVML + the pool trace); None = not readable here."""

    vram_peak_gib: float | None = None
    vram_total_gib: float | None = None
    sm_clock_min_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    throttle_reasons: list[str] = field(default_factory=list)
    pcie: str = ""  # "gen5 x16 (max gen5 x16)" or "" when unknown
    pcie_below_max: bool = False
    coverage_pct: float | None = None
    churn_per_s: float | None = None
    gpu_note: str = ""  # "SIMULATED GPU" / NVML error


@dataclass
class SelfTestResult:
    profile_id: str
    image_id: str
    recipe_hash: str
    date: str  # ISO-8601 UTC
    simulated: bool
    card_decode_tok_s: float | None
    plan: dict[str, object]
    decode: list[DecodeRun] = field(default_factory=list)
    ttft: list[TtftPoint] = field(default_factory=list)
    needles: list[NeedleOutcome] = field(default_factory=list)
    telemetry: TelemetrySummary = field(default_factory=TelemetrySummary)
    wall_s: float = 0.0
    build: str = ""  # the engine build that served (docs/engine.md "Upgrading the engine"); "" before issue 45
    gpu: int | None = None  # the GPU whose engine was measured, on a box of several (docs/engine.md "Several GPUs")

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: JsonObject) -> "SelfTestResult":
        return cls(
            profile_id=d["profile_id"], image_id=d["image_id"], recipe_hash=d["recipe_hash"], date=d["date"],
            simulated=bool(d.get("simulated")), card_decode_tok_s=d.get("card_decode_tok_s"), plan=d.get("plan", {}),
            decode=[DecodeRun(**x) for x in d.get("decode", [])], ttft=[TtftPoint(**x) for x in d.get("ttft", [])],
            needles=[NeedleOutcome(**x) for x in d.get("needles", [])],
            telemetry=TelemetrySummary(**d.get("telemetry", {})), wall_s=float(d.get("wall_s", 0.0)),
            build=str(d.get("build", "")),
            gpu=d["gpu"] if isinstance(d.get("gpu"), int) and not isinstance(d.get("gpu"), bool) else None,
        )


def _int(v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise TypeError(f"expected a number, got {v!r}")
    return int(v)


def _ints(v: object) -> tuple[int, ...]:
    if not isinstance(v, (list, tuple)):
        raise TypeError(f"expected a list of numbers, got {v!r}")
    return tuple(_int(x) for x in v)
