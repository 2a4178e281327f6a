"""Blind pairing and the reveal. Sides are shuffled per cell (deterministically from the run id, so a
restart shows the same layout) and profile names are never part of a `BlindPair`.

A pair is graded either by a pick (left / right / tie) or by a 0–10 score per side. The reveal reports
the preference (every grade as +1/0/−1 for B, a score grade by the sign of its difference) and, over
the score-graded pairs, the paired mean score difference B − A in points — both seed-blocked with a
90% CI by the same statistics (stats.py, docs/selftest.md "Blind A/B")."""

from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import asdict, dataclass

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
    context: int = 0  # earlier chat messages sent before the prompt (a turn picked from chat history)


def a_is_left(run_id: str, prompt_id: str, seed: int) -> bool:
    return hashlib.sha256(f"{run_id}/{prompt_id}/{seed}".encode()).digest()[0] % 2 == 0


def blind_pairs(st: RunState) -> list[BlindPair]:
    """Every cell generated on both sides, in prompt × seed order."""
    prompts = {p.id: p for p in st.spec.prompts}
    out: list[BlindPair] = []
    for pid, seed in st.spec.cells:
        a, b = st.gens.get(("A", pid, seed)), st.gens.get(("B", pid, seed))
        if a is None or b is None:
            continue
        left, right = (a.text, b.text) if a_is_left(st.spec.run_id, pid, seed) else (b.text, a.text)
        p = prompts[pid]
        out.append(BlindPair(len(out), pid, seed, p.text, left, right, (pid, seed) in st.grades, len(p.context)))
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
    """Scores 0–10 as the grader saw the sides -> a Grade with diff = score(B) - score(A)."""
    for v in (left, right):
        if not 0 <= v <= 10:
            raise ValueError(f"scores are 0–10, got {v:g}")
    a, b = (left, right) if a_is_left(st.spec.run_id, prompt_id, seed) else (right, left)
    return Grade(prompt_id, seed, float(b - a), "", float(left), float(right), note)


def ab_scores(st: RunState, g: Grade) -> tuple[float, float] | None:
    """(score of A, score of B) of a score grade; None for a pick."""
    if g.left is None or g.right is None:
        return None
    if a_is_left(st.spec.run_id, g.prompt_id, g.seed):
        return g.left, g.right
    return g.right, g.left


def _sign(x: float) -> float:
    return 1.0 if x > 0 else -1.0 if x < 0 else 0.0


@dataclass(frozen=True)
class ScoreSummary:
    """Over the score-graded pairs: B − A in points (0–10 scale), seed-blocked, and each side's mean."""

    points: Summary
    mean_a: float
    mean_b: float
    pairs: int


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
    summary: Summary  # preference over every graded pair: +1 B better, 0 tie, −1 A better
    a: SideStats
    b: SideStats
    graded: int
    cells: int
    scores: ScoreSummary | None = None  # when at least one pair was scored 0–10
    rubric: str = ""
    caution: str = CAUTION

    def headline(self) -> str:
        s = self.summary
        wtl = f"win/tie/loss for B {s.wins}/{s.ties}/{s.losses}"
        if self.scores is not None and self.scores.pairs == self.graded:  # all scored: the points are primary
            p = self.scores.points
            return (f"B ({self.profile_b}) − A ({self.profile_a}): {p.seed_blocked.text()} points (0–10) "
                    f"seed-blocked; {wtl} — {p.verdict}")
        return f"B ({self.profile_b}) − A ({self.profile_a}): {s.seed_blocked.text()} seed-blocked; {wtl} — {s.verdict}"


def _side(st: RunState, side: str, profile: str) -> SideStats:
    gens = [g for (sd, _, _), g in st.gens.items() if sd == side]
    rates = [g.tok_s for g in gens if g.tok_s]
    return SideStats(profile, len(gens), statistics.median(rates) if rates else None,
                     sum(g.wall_s for g in gens), sum(g.tokens for g in gens))


def reveal(st: RunState) -> Reveal:
    """Raises ValueError until at least one pair is graded."""
    grades = list(st.grades.values())
    prefs = [Pair(g.prompt_id, g.seed, _sign(g.diff)) for g in grades]
    scored = [(g, ab) for g in grades if (ab := ab_scores(st, g)) is not None]
    scores = None
    if scored:
        points = summarise([Pair(g.prompt_id, g.seed, b - a) for g, (a, b) in scored], bound=10.0)
        scores = ScoreSummary(points, statistics.fmean(a for _, (a, _b) in scored),
                              statistics.fmean(b for _, (_a, b) in scored), len(scored))
    return Reveal(st.spec.profile_a, st.spec.profile_b, summarise(prefs, bound=1.0), _side(st, "A", st.spec.profile_a),
                  _side(st, "B", st.spec.profile_b), len(prefs), len(st.spec.cells), scores, st.rubric)


def reveal_markdown(r: Reveal) -> str:
    s = r.summary
    rows = [f"| {x.profile} | {x.answers} | {x.median_tok_s:.1f} | {x.tokens} | {x.wall_s:.0f} |"
            if x.median_tok_s is not None else f"| {x.profile} | {x.answers} | — | {x.tokens} | {x.wall_s:.0f} |"
            for x in (r.a, r.b)]
    score_lines: list[str] = []
    if r.scores is not None:
        p = r.scores.points
        score_lines = ["", f"## Scores (0–10), {r.scores.pairs} scored pair{'s' if r.scores.pairs != 1 else ''}", "",
                       f"- mean score: A ({r.profile_a}) {r.scores.mean_a:.2f}, B ({r.profile_b}) {r.scores.mean_b:.2f}",
                       f"- B − A in points, seed-blocked (primary): {p.seed_blocked.text()} — {p.verdict}",
                       f"- pooled over pairs (overstates precision): {p.pooled.text()}",
                       f"- win/tie/loss for B by score: {p.wins}/{p.ties}/{p.losses}"]
        if r.rubric:
            score_lines += [f"- rubric: {' '.join(r.rubric.split())}"]
    return "\n".join([
        f"# Blind A/B: A = {r.profile_a}, B = {r.profile_b}", "",
        f"**{r.headline()}**", "",
        "## Preference (B better +1, tie 0, A better −1; a scored pair by its sign)", "",
        f"- seed-blocked (primary): {s.seed_blocked.text()} — {s.verdict}",
        f"- pooled over cells (overstates precision): {s.pooled.text()}",
        f"- win/tie/loss for B: {s.wins}/{s.ties}/{s.losses}",
        f"- graded {r.graded} of {r.cells} pairs", *score_lines, "",
        "| profile | answers | median tok/s | tokens | wall s |", "|---|---|---|---|---|", *rows, "",
        f"> {r.caution}", ""])


def reveal_json(r: Reveal) -> str:
    """The reveal as JSON (CLI `reveal --json`, the Compare tab's JSON export)."""
    return json.dumps({**asdict(r), "headline": r.headline()}, indent=2)
