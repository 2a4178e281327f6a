"""The A/B run's journal: one JSONL file per run under <state>/abtest/, appended and fsynced line by
line, so a panel restart resumes where it stopped (every finished generation and grade is kept; a
half-written last line from a crash is ignored). Records:

  {"type": "header", ...ABSpec}            first line
  {"type": "gen", side, prompt_id, seed, text, tokens, tok_s, wall_s, finish}
  {"type": "grade", prompt_id, seed, diff, pick, left, right, note}   (the latest grade of a cell wins)
  {"type": "rubric", text}                 what the grader scores against (the latest wins)
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Sequence

from app.backend.contracts import JsonObject

Side = Literal["A", "B"]
Turn = tuple[str, str]  # (role, content) of an earlier chat message sent before the prompt
_SAFE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    source: str = ""  # where it came from: "" (pasted/imported) or "chat <conversation id> turn <n>"
    context: tuple[Turn, ...] = ()  # a chat turn's system prompt and earlier turns, sent before it

    def messages(self) -> list[dict[str, str]]:
        return [{"role": r, "content": c} for r, c in self.context] + [{"role": "user", "content": self.text}]


@dataclass(frozen=True)
class ABSpec:
    run_id: str
    profile_a: str
    profile_b: str
    prompts: tuple[Prompt, ...]
    seeds: tuple[int, ...]
    max_tokens: int
    created: str
    rubric: str = ""  # the rubric at creation; a later "rubric" record replaces it (RunState.rubric)

    def __post_init__(self) -> None:
        if self.profile_a == self.profile_b:
            raise ValueError("pick two different profiles for A and B")
        if not self.prompts:
            raise ValueError("no prompts: paste some, import a JSONL file, or pick from chat history")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError("give one or more distinct seeds (the card: only extra seeds add real information)")
        if self.max_tokens < 16:
            raise ValueError(f"max tokens must be at least 16, got {self.max_tokens}")

    @property
    def cells(self) -> list[tuple[str, int]]:
        return [(p.id, s) for s in self.seeds for p in self.prompts]


@dataclass(frozen=True)
class Generation:
    side: Side
    prompt_id: str
    seed: int
    text: str
    tokens: int
    tok_s: float | None
    wall_s: float
    finish: str


@dataclass(frozen=True)
class Grade:
    prompt_id: str
    seed: int
    diff: float  # score(B) - score(A), or +1/0/-1 for a pick
    pick: str = ""  # "left" | "right" | "tie" (what the grader saw), "" for scores
    left: float | None = None
    right: float | None = None
    note: str = ""


@dataclass
class RunState:
    spec: ABSpec
    gens: dict[tuple[Side, str, int], Generation] = field(default_factory=dict)
    grades: dict[tuple[str, int], Grade] = field(default_factory=dict)
    rubric: str = ""

    def missing(self, side: Side) -> list[tuple[str, int]]:
        return [c for c in self.spec.cells if (side, *c) not in self.gens]

    @property
    def generated(self) -> int:
        return len(self.gens)

    @property
    def total(self) -> int:
        return 2 * len(self.spec.cells)


def new_spec(profile_a: str, profile_b: str, prompts: Sequence[str | Prompt], seeds: list[int], max_tokens: int,
             rubric: str = "") -> ABSpec:
    """Prompts are numbered p1, p2, ... in order; blank ones and exact repeats (same text and context) are dropped."""
    if max_tokens < 16:
        raise ValueError(f"max tokens per answer: {max_tokens} is too few for an answer (16 or more)")
    now = dt.datetime.now(dt.timezone.utc)
    run_id = now.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)
    ps: list[Prompt] = []
    seen: set[tuple[str, tuple[Turn, ...]]] = set()
    for item in prompts:
        p = item if isinstance(item, Prompt) else Prompt("", item)
        text = p.text.strip()
        if not text or (text, p.context) in seen:
            continue
        seen.add((text, p.context))
        ps.append(Prompt(f"p{len(ps) + 1}", text, p.source, p.context))
    return ABSpec(run_id, profile_a, profile_b, tuple(ps), tuple(seeds), max_tokens, now.isoformat(timespec="seconds"),
                  rubric.strip())


def parse_prompts_jsonl(text: str) -> list[str]:
    """Lines of {"prompt": "..."} (or a bare JSON string); a bad line is an error naming its number."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise ValueError(f"line {n} is not JSON: {line[:60]!r}") from None
        value = obj.get("prompt") if isinstance(obj, dict) else obj
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f'line {n}: expected {{"prompt": "..."}} or a JSON string')
        out.append(value)
    return out


def parse_pasted(text: str) -> list[str]:
    """Pasted prompts: separated by a line holding only '---' (a prompt may span lines)."""
    return [p.strip() for p in re.split(r"(?m)^---\s*$", text or "") if p.strip()]


class Journal:
    def __init__(self, state_dir: Path):
        self.root = Path(state_dir) / "abtest"

    def path(self, run_id: str) -> Path:
        if not _SAFE.match(run_id):
            raise ValueError(f"not a run id: {run_id!r}")
        return self.root / f"{run_id}.jsonl"

    def create(self, spec: ABSpec) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        header = {"type": "header", **asdict(spec)}
        with open(self.path(spec.run_id), "x", encoding="utf-8") as fh:
            fh.write(json.dumps(header) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def append(self, run_id: str, record: Generation | Grade) -> None:
        kind = "gen" if isinstance(record, Generation) else "grade"
        self._write(run_id, {"type": kind, **asdict(record)})

    def set_rubric(self, run_id: str, text: str) -> None:
        """Journal the rubric the grader scores against (shown beside every pair; the latest wins)."""
        self.load(run_id)  # a known run only
        self._write(run_id, {"type": "rubric", "text": text.strip()})

    def _write(self, run_id: str, rec: dict[str, object]) -> None:
        with open(self.path(run_id), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    def load(self, run_id: str) -> RunState:
        path = self.path(run_id)
        if not path.exists():
            raise KeyError(f"no A/B run {run_id!r} (known: {', '.join(self.runs()) or 'none'})")
        state: RunState | None = None
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec: JsonObject = json.loads(line)
            except ValueError:
                continue  # a torn last line after a crash
            kind = rec.pop("type", "")
            if kind == "header":
                rec["prompts"] = tuple(Prompt(p["id"], p["text"], p.get("source", ""),
                                              tuple((str(r), str(c)) for r, c in p.get("context", ())))
                                       for p in rec["prompts"])
                rec["seeds"] = tuple(rec["seeds"])
                spec = ABSpec(**rec)
                state = RunState(spec, rubric=spec.rubric)
            elif state is not None and kind == "rubric":
                state.rubric = str(rec.get("text", ""))
            elif state is not None and kind == "gen":
                g = Generation(**rec)
                state.gens[(g.side, g.prompt_id, g.seed)] = g
            elif state is not None and kind == "grade":
                gr = Grade(**rec)
                state.grades[(gr.prompt_id, gr.seed)] = gr
        if state is None:
            raise ValueError(f"A/B journal {path} has no header line")
        return state

    def runs(self) -> list[str]:
        return sorted((p.stem for p in self.root.glob("*.jsonl")), reverse=True) if self.root.is_dir() else []
