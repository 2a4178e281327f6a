"""HTML for the Profiles tab: profile cards, the speed-vs-quality chart (inline SVG), study tables, findings.

Pure functions of recipe data (no Gradio, no I/O), every recipe/user string escaped. The chart is a small
inline SVG rather than a plotting library: three points with error bars, crisp at any width, readable by
screen readers (role="img" + a text description), and nothing extra to install or load.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape as _escape

from app.backend.contracts import count_text
from app.backend.recipe.command import NO_REASON, ExplainedLine
from app.backend.recipe.schema import Finding, ProfileSpec, Recipe, StudyTable, cell_text
from app.backend.selftest.report import Standing

# The card's ⭐ (U+2B50) needs a colour-emoji font, which many boxes and headless browsers lack (an empty
# box, issue 29); ★ (U+2605) is in DejaVu and every common text font. The card's text keeps its ⭐.
STAR, TEXT_STAR = "\u2b50", "\u2605"


def glyphs(text: str) -> str:
    """Card text with glyphs every text font has (⭐ → ★)."""
    return text.replace(STAR, TEXT_STAR)


def escape(text: str, quote: bool = True) -> str:
    return _escape(glyphs(text), quote)


def _fmt(v: float) -> str:
    return f"{v:+.2f}".replace("-", "−")


def delta_text(p: ProfileSpec) -> str:
    if p.delta_vs_1 is None:
        return "— (reference)" if p.measured else "not measured"
    lo, hi = p.delta_vs_1.ci90
    return f"{_fmt(p.delta_vs_1.mean)} /30 (90% CI [{_fmt(lo)}, {_fmt(hi)}])"


def figures(p: ProfileSpec) -> dict[str, str]:
    """The card's figures for one profile, as label → text (what the UI and the browser test read)."""
    if not p.measured:
        return {"decode": "not measured", "quality": "not measured", "delta": "not measured"}
    decode = f"{p.decode.shown} {p.decode.unit}" if p.decode else "—"  # the card's form: "75.0", not "75"
    quality = p.quality_label or (f"{p.quality.shown} {p.quality.unit}" if p.quality else "—")
    return {"decode": decode, "quality": quality, "delta": delta_text(p)}


def selftest_line(pid: str, st: Standing | None) -> str:
    """This box's latest self-test under a card's figures (docs/selftest.md): the card line, or that it never ran;
    when the engine image or the profile's command changed since, says so."""
    if st is None:
        return (f'<div class="moet-selftest" data-selftest="{escape(pid)}" data-state="none">'
                "this box: not self-tested yet</div>")
    stale = (f'<br><b class="st-stale">{escape(st.stale)}: run it again</b>' if st.stale else "")
    return (f'<div class="moet-selftest" data-selftest="{escape(pid)}" data-state="{"stale" if st.stale else "current"}">'
            f'<span class="moet-selftest-line">{escape(st.line)}</span> — {escape(st.verdict)}{stale}</div>')


def profile_cards(recipe: Recipe, profiles: list[ProfileSpec], selected: str, findings: dict[str, list[Finding]],
                  standings: Mapping[str, Standing | None] | None = None) -> str:
    """`standings`: this box's self-test per profile id, shown under the card's figures (omitted: not shown)."""
    sim = ' <span class="moet-sim-tag">SIMULATED</span>' if recipe.simulated else ""
    cards = []
    for p in profiles:
        f = figures(p)
        badges = ""
        if p.recommended:
            badges += ' <span class="moet-badge">recommended</span>'
        if not p.measured:
            badges += ' <span class="moet-badge custom">custom</span>'
        cls = "moet-card selected" if p.id == selected else "moet-card"
        title = f"#{p.number} · {escape(p.title)}" if p.measured else escape(p.title)
        notes = "".join(f"<li>{escape(n)}</li>" for n in p.notes)
        fig_notes = [(k, fig.note) for k, fig in (("decode", p.decode), ("quality", p.quality), ("Δ vs #1", p.delta_vs_1)) if fig]
        if fig_notes:
            notes += '<li class="moet-fignotes">From the card: <ul>' + "".join(
                f'<li data-fignote="{escape(k)}"><b>{escape(k)}:</b> {escape(n)}</li>' for k, n in fig_notes) + "</ul></li>"
        warn = findings.get(p.id) or []
        if warn:
            applies = "applies" if len(warn) == 1 else "apply"
            notes += f'<li class="moet-notmeasured">{count_text(len(warn), "card warning")} {applies} — see below</li>'
        value_cls = ' class="moet-notmeasured"' if not p.measured else ""
        cards.append(
            f'<article class="{cls}" data-profile="{escape(p.id)}" aria-label="profile {escape(p.id)}">'
            f"<h3>{title}{badges}{sim}</h3>"
            f'<div class="sub">{escape(p.scheduler_setting)}'
            + (f" · cloned from {escape(p.based_on)}" if p.based_on else "")
            + "</div>"
            f'<dl class="moet-figs">'
            f'<dt>decode</dt><dd data-fig="decode"{value_cls}>{escape(f["decode"])}</dd>'
            f'<dt>quality</dt><dd data-fig="quality"{value_cls}>{escape(f["quality"])}</dd>'
            f'<dt>Δ vs #1</dt><dd data-fig="delta"{value_cls}>{escape(f["delta"])}</dd>'
            f"</dl>"
            + (selftest_line(p.id, standings.get(p.id)) if standings is not None else "")
            + f"<ul>{notes}</ul></article>"
        )
    return f'<div class="moet-cards" id="profile-cards">{"".join(cards)}</div>'


def _frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Pareto frontier (faster and better is better), left to right."""
    keep = [p for p in points if not any(q != p and q[0] >= p[0] and q[1] >= p[1] for q in points)]
    return sorted(keep)


def speed_quality_chart(recipe: Recipe, profiles: list[ProfileSpec], selected: str) -> str:
    measured = [p for p in profiles if p.measured and p.decode]
    pts = [(p, p.decode.value, p.delta_vs_1.mean if p.delta_vs_1 else 0.0) for p in measured]  # type: ignore[union-attr]
    shown = {p.id: p.decode.shown for p in measured}  # type: ignore[union-attr]
    if not pts:
        return "<p>No measured profiles in this recipe.</p>"
    w, h, ml, mr, mt, mb = 640, 320, 62, 20, 24, 46
    xs = [x for _, x, _ in pts]
    lows = [p.delta_vs_1.ci90[0] for p, _, _ in pts if p.delta_vs_1] + [0.0]
    highs = [p.delta_vs_1.ci90[1] for p, _, _ in pts if p.delta_vs_1] + [0.0]
    x0, x1 = (min(xs) // 10) * 10 - 5, (max(xs) // 10) * 10 + 15
    y0, y1 = float(int(min(lows)) - 1), max(1.0, float(int(max(highs)) + 1))

    def sx(x: float) -> float:
        return ml + (x - x0) / (x1 - x0) * (w - ml - mr)

    def sy(y: float) -> float:
        return mt + (y1 - y) / (y1 - y0) * (h - mt - mb)

    parts = [f'<line x1="{ml}" y1="{sy(0):.1f}" x2="{w - mr}" y2="{sy(0):.1f}" stroke="#94a3b8" stroke-dasharray="4 3"/>']
    for t in range(int(x0), int(x1) + 1, 10):
        parts.append(f'<line x1="{sx(t):.1f}" y1="{h - mb}" x2="{sx(t):.1f}" y2="{h - mb + 4}" stroke="#64748b"/>'
                     f'<text x="{sx(t):.1f}" y="{h - mb + 17}" text-anchor="middle" font-size="11" fill="#475569">{t}</text>')
    step = 2 if (y1 - y0) > 6 else 1
    for t in range(int(y0), int(y1) + 1, step):
        parts.append(f'<line x1="{ml - 4}" y1="{sy(t):.1f}" x2="{ml}" y2="{sy(t):.1f}" stroke="#64748b"/>'
                     f'<text x="{ml - 7}" y="{sy(t) + 4:.1f}" text-anchor="end" font-size="11" fill="#475569">{t:+d}</text>')
    parts.append(f'<line x1="{ml}" y1="{mt}" x2="{ml}" y2="{h - mb}" stroke="#64748b"/>'
                 f'<line x1="{ml}" y1="{h - mb}" x2="{w - mr}" y2="{h - mb}" stroke="#64748b"/>')
    parts.append(f'<text x="{(ml + w - mr) / 2}" y="{h - 8}" text-anchor="middle" font-size="12" fill="#334155">'
                 "decode tok/s (single stream, 256K context)</text>"
                 f'<text transform="translate(14 {(mt + h - mb) / 2}) rotate(-90)" text-anchor="middle" font-size="12" '
                 'fill="#334155">quality Δ vs profile 1 (/30, 90% CI)</text>')
    front = _frontier([(x, y) for _, x, y in pts])
    if len(front) > 1:
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in front)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#0d9488" stroke-width="2" stroke-opacity="0.55"/>')
    for p, x, y in pts:
        if p.delta_vs_1:
            lo, hi = p.delta_vs_1.ci90
            parts.append(f'<line x1="{sx(x):.1f}" y1="{sy(lo):.1f}" x2="{sx(x):.1f}" y2="{sy(hi):.1f}" stroke="#334155" '
                         'stroke-width="1.5"/>'
                         f'<line x1="{sx(x) - 5:.1f}" y1="{sy(lo):.1f}" x2="{sx(x) + 5:.1f}" y2="{sy(lo):.1f}" stroke="#334155"/>'
                         f'<line x1="{sx(x) - 5:.1f}" y1="{sy(hi):.1f}" x2="{sx(x) + 5:.1f}" y2="{sy(hi):.1f}" stroke="#334155"/>')
        sel = p.id == selected
        fill = "#0f766e" if sel else "#ffffff"
        parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="{7 if sel else 5}" fill="{fill}" stroke="#0f766e" stroke-width="2"/>'
                     f'<text x="{sx(x) + 9:.1f}" y="{sy(y) - 8:.1f}" font-size="12" font-weight="{700 if sel else 400}" '
                     f'fill="#0f172a">#{p.number} {escape(p.title)}</text>')
    desc = "; ".join(f"profile {p.number} {p.title}: {shown[p.id]} tok/s, Δ {y:+.2f}" for p, x, y in pts)
    label = f"Speed versus quality of the measured profiles. {desc}."
    customs = [p for p in profiles if not p.measured]
    sim = " SIMULATED engine: the figures are the model card's, not measured here." if recipe.simulated else ""
    caption = ("Each point is a profile from the card; bars are 90% confidence intervals of the quality "
               "difference vs profile 1; the line is the speed/quality frontier." + sim)
    if customs:
        caption += f" Custom profiles ({', '.join(escape(p.title) for p in customs)}) are not measured and not plotted."
    return (f'<figure class="moet-chart" id="speed-quality-chart"><svg viewBox="0 0 {w} {h}" role="img" '
            f'aria-label="{escape(label)}"><title>{escape(label)}</title>{"".join(parts)}</svg>'
            f"<figcaption>{escape(caption) if not customs else caption}</figcaption></figure>")


def study_tables(studies: list[StudyTable]) -> str:
    """Every study with its rows (numbers in the card's text form), note, further statistics and footnotes."""
    out = []
    for s in studies:
        head = "".join(f'<th scope="col">{escape(c)}</th>' for c in s.columns)
        rows = []
        for row in s.rows:
            cells = "".join(
                f'<td class="num">{escape(cell_text(v))}</td>' if not isinstance(v, str) else f"<td>{escape(v)}</td>" for v in row
            )
            rows.append(f"<tr>{cells}</tr>")
        paras = ([s.note] if s.note else []) + list(s.details)
        text = "".join(f"<p>{escape(t)}</p>" for t in paras)
        text += "".join(f'<p class="moet-footnote">{escape(t)}</p>' for t in s.footnotes)
        out.append(f'<div class="moet-study" data-study="{escape(s.id)}"><table><caption>{escape(s.title)}</caption>'
                   f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>{text}</div>")
    return "".join(out) or "<p>This recipe has no study tables.</p>"


def explained_command(lines: list[ExplainedLine]) -> str:
    """The equivalent docker run, one row per line, with the card's reason for it beside it."""
    rows = []
    for e in lines:
        if e.source == "card":
            why = f'<span class="moet-why-card">card:</span> {escape(e.why)}'
        elif e.source == "panel":
            why = f'<span class="moet-why-panel">{escape(e.why)}</span>'
        else:
            why = f'<span class="moet-notmeasured">{NO_REASON}</span>'
        rows.append(f'<tr data-why-source="{escape(e.source or "none")}"><td style="{_CELL};width:38%;word-break:break-all">'
                    f'<code>{escape(e.text)}</code></td><td style="{_CELL}">{why}</td></tr>')
    return ('<table class="moet-why" id="command-why" style="font-size:13px;border-collapse:collapse;width:100%">'
            '<caption>Why each line — the card\'s “Why each knob” words, or why the panel adds it</caption>'
            f'<thead><tr><th scope="col" style="{_CELL}">line</th><th scope="col" style="{_CELL}">why</th></tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table>")


_CELL = "padding:3px 8px;vertical-align:top;line-height:1.35"


def _table(caption: str, columns: list[str], rows: list[list[str]], elem: str) -> str:
    head = "".join(f'<th scope="col">{escape(c)}</th>' for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table id="{elem}"><caption>{escape(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def card_facts(recipe: Recipe) -> str:
    """Everything else the recipe carries: model, context/needle table, VRAM budget, pins, requirements,
    sampling, the single-GPU limit and the card's cache-regeneration recipe (docs/card.md)."""
    parts: list[str] = []
    m, e, req = recipe.model, recipe.engine, recipe.requirements
    if m.params_note:
        parts.append(f'<p id="card-params"><b>What is quantized:</b> {escape(m.params_note)}</p>')
    ctx = recipe.context
    parts.append(_table(ctx.needles_title or "Context (needle-in-a-haystack)", ["length", "result", "note"],
                        [[n.length, n.result, n.note] for n in ctx.needles], "card-context"))
    parts.append(f"<p>{escape(ctx.note)}</p>")
    parts.append(f'<p id="card-vram"><b>VRAM budget:</b> {escape(recipe.vram.note)}</p>')
    pins = [["model", f"{m.name} @ {m.revision}"], ["engine", f"{e.repo_url} @ {e.commit} ({e.dockerfile} → {e.image})"]]
    pins += [[k, v] for k, v in recipe.pins.items()]
    parts.append(_table("Pins", ["what", "value"], pins, "card-pins"))
    reqs = [["GPU", f"{req.gpu} (sm_{req.compute_capability.replace('.', '')})" if req.compute_capability else req.gpu]]
    if req.ecc_note:
        reqs.append(["ECC", req.ecc_note])
    if req.host_ram_note:
        reqs.append(["host RAM (cache miss)", req.host_ram_note])
    if req.multi_gpu_note:
        reqs.append(["GPUs", req.multi_gpu_note])
    parts.append(_table("Requirements", ["what", "the card"], reqs, "card-requirements"))
    s = recipe.sampling
    parts.append(f'<p id="card-sampling"><b>Sampling:</b> {escape(s.note)} {escape(s.never_zero_note)}</p>')
    if recipe.regenerate:
        g = recipe.regenerate
        parts.append(
            '<section id="card-regenerate"><h4>Regenerate caches</h4>'
            f"<p>{escape(g.note)}</p><ul>"
            f"<li>host RAM: ≥ {g.host_ram_gib:g} GiB (the card's “big-RAM box”)</li>"
            f"<li>GPUs: TP{g.gpu_count} on one GPU</li>"
            + (f"<li>time: ~{g.minutes:g} min on {escape(g.measured_on)}</li>" if g.minutes else "")
            + (f"<li>base pack: a second boot with VLLM_MOE_W2_BASE_CACHE_GB={g.base_cache_gb:g}</li>" if g.base_cache_gb else "")
            + "</ul><p class=\"moet-notmeasured\">Not built in this version: the panel states the card's recipe and "
            "does not start that boot (it needs the host above and empty writable cache dirs, and rewrites the caches "
            "the profiles read). Run it by hand; docs/card.md says how.</p></section>"
        )
    return f'<div class="moet-card-facts" id="card-facts">{"".join(parts)}</div>'


def findings_list(findings: list[Finding], what: str, risks: list[str] | None = None) -> str:
    """The card's warnings that apply (the card's words), then the panel's expert-setting risks, if any."""
    expert = "".join(f'<li class="warn" data-expert-risk="1"><strong>EXPERT</strong> {escape(r)}</li>' for r in risks or [])
    if not findings and not expert:
        return f'<p class="moet-ok" id="findings-none">No card warnings apply to {escape(what)}.</p>'
    items = expert + "".join(
        f'<li class="{escape(f.severity)}" data-finding="{escape(f.id)}"><strong>{escape(f.severity.upper())}</strong> '
        f"{escape(f.message)}</li>"
        for f in findings
    )
    return f'<ul class="moet-findings" id="findings" aria-label="card warnings for {escape(what)}">{items}</ul>'
