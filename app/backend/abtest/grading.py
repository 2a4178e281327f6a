"""Blind pairing and the reveal. Sides are shuffled per cell (deterministically from the run id, so a
restart shows the same layout) and profile names are never part of a `BlindPair`."""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import dataclass

from app.backend.abtest.journal import Grade, RunState
from app.backend.abtest.stats import Pair, Summary, summarise

CAUTION = ("The card's caution: per-task luck (sd 2.95) exceeded the config signal (sd 1.98); a decisive "
           "ranking needed ~25–30 tasks × ~5 generations, and only extra seeds add real information — "
           "re-judging the same answers re-measures one draw.")


@dataclass(frozen=True)
class BlindPair:
    index: int
    prompt_id: str
    seed: int
    prompt: str
    left: str
    right: str
    graded: bool


def a_is_left(run_id: str, prompt_id: str, seed: int) -> bool:
    return hashlib.sha256(f"{run_id}/{prompt_id}/{seed}".encode()).digest()[0] % 2 == 0


def blind_pairs(st: RunState) -> list[BlindPair]:
    """Every cell generated on both sides, in prompt × seed order."""
    texts = {p.id: p.text for p in st.spec.prompts}
    out = []
    for pid, seed in st.spec.cells:
        a, b = st.gens.get(("A", pid, seed)), st.gens.get(("B", pid, seed))
        if a is None or b is None:
            continue
        left, right = (a.text, b.text) if a_is_left(st.spec.run_id, pid, seed) else (b.text, a.text)
        out.append(BlindPair(len(out), pid, seed, texts[pid], left, right, (pid, seed) in st.grades))
    return out


def grade_from_pick(st: RunState, prompt_id: str, seed: int, pick: str, note: str = "") -> Grade:
    """'left' | 'right' | 'tie' as the grader saw it -> B - A in {+1, 0, -1}."""
    if pick not in ("left", "right", "tie"):
        raise ValueError(f"pick must be left, right or tie, got {pick!r}")
    if pick == "tie":
        return Grade(prompt_id, seed, 0.0, pick, note=note)
    left_is_a = a_is_left(st.spec.run_id, prompt_id, seed)
    a_won = (pick == "left") == left_is_a
    return Grade(prompt_id, seed, -1.0 if a_won else 1.0, pick, note=note)


def grade_from_scores(st: RunState, prompt_id: str, seed: int, left: float, right: float, note: str = "") -> Grade:
    for v in (left, right):
        if not 0 <= v <= 10:
            raise ValueError(f"scores are 0–10, got {v}")
    a, b = (left, right) if a_is_left(st.spec.run_id, prompt_id, seed) else (right, left)
    return Grade(prompt_id, seed, float(b - a), "", left, right, note)


@dataclass(frozen=True)
class SideStats:
    profile: str
    answers: int
    median_tok_s: float | None
    wall_s: float
    tokens: int


@dataclass(frozen=True)
class Reveal:
    profile_a: str
    profile_b: str
    summary: Summary
    a: SideStats
    b: SideStats
    graded: int
    cells: int
    caution: str = CAUTION

    def headline(self) -> str:
        s = self.summary
        return (f"B ({self.profile_b}) − A ({self.profile_a}): {s.seed_blocked.text()} seed-blocked; "
                f"win/tie/loss for B {s.wins}/{s.ties}/{s.losses} — {s.verdict}")


def _side(st: RunState, side: str, profile: str) -> SideStats:
    gens = [g for (sd, _, _), g in st.gens.items() if sd == side]
    rates = [g.tok_s for g in gens if g.tok_s]
    return SideStats(profile, len(gens), statistics.median(rates) if rates else None,
                     sum(g.wall_s for g in gens), sum(g.tokens for g in gens))


def reveal(st: RunState) -> Reveal:
    """Raises ValueError until at least one pair is graded."""
    pairs = [Pair(g.prompt_id, g.seed, g.diff) for g in st.grades.values()]
    return Reveal(st.spec.profile_a, st.spec.profile_b, summarise(pairs), _side(st, "A", st.spec.profile_a),
                  _side(st, "B", st.spec.profile_b), len(pairs), len(st.spec.cells))


def reveal_markdown(r: Reveal) -> str:
    s = r.summary
    rows = [f"| {x.profile} | {x.answers} | {x.median_tok_s:.1f} | {x.tokens} | {x.wall_s:.0f} |"
            if x.median_tok_s is not None else f"| {x.profile} | {x.answers} | — | {x.tokens} | {x.wall_s:.0f} |"
            for x in (r.a, r.b)]
    return "\n".join([
        f"# Blind A/B: A = {r.profile_a}, B = {r.profile_b}", "",
        f"**{r.headline()}**", "",
        f"- seed-blocked (primary): {s.seed_blocked.text()}",
        f"- pooled over cells (overstates precision): {s.pooled.text()}",
        f"- graded {r.graded} of {r.cells} pairs", "",
        "| profile | answers | median tok/s | tokens | wall s |", "|---|---|---|---|---|", *rows, "",
        f"> {r.caution}", ""])
