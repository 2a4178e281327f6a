// The Telemetry tab's live plots (issue 42; docs/telemetry.md, "Live plots"): drawn on canvas with dygraphs
// (Debian's libjs-dygraphs, served by the panel at /moet/js/), fed by the page feed with the window's samples
// once and then only the new ones (app/backend/telemetry/livefeed.py). One time range for every plot (the
// window, ending now); a plot with no value in it says "no data yet"; a null value breaks the line (a gap);
// hovering shows the values. Nothing runs while the tab is not shown: the feed sends no points then.
// A redraw costs style, layout and paint (dygraphs rebuilds its axis labels): a plot on screen is redrawn at
// most once a second and not before the time axis has moved by a pixel (a 1 h window: every ~4 s on a wide
// plot); one off screen every 30 s, and at once when scrolled into view (issue 49; docs/ui-and-safety.md,
// "The page at its floor").
(() => {
  "use strict";
  const LIB = "/moet/js/dygraph.min.js", CSS = "/moet/js/dygraph.min.css";
  const MIN_GAP_MS = 1000, OFF_SCREEN_MS = 30000;
  let rows = [], windowS = 900, loading = null;
  const graphs = {};  // plot element id -> Dygraph
  const onScreen = new Set();  // plot element ids in the viewport (IntersectionObserver)
  const stale = new Set();  // plot element ids with samples they have not drawn
  const drawnAt = {};  // plot element id -> page clock of its last redraw
  const stats = { draws: 0 };  // redraws done (tests, benches)
  let seen = null, timer = null, lastDraw = -Infinity;

  const load = () => {
    if (window.Dygraph) return Promise.resolve();
    if (!loading) {
      loading = new Promise((resolve, reject) => {
        const css = document.createElement("link");
        css.rel = "stylesheet"; css.href = CSS;
        document.head.appendChild(css);
        const s = document.createElement("script");
        s.src = LIB; s.onload = resolve; s.onerror = reject;
        document.head.appendChild(s);
      });
    }
    return loading;
  };

  const pad = (n) => String(n).padStart(2, "0");
  const hms = (ms) => { const d = new Date(ms); return `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())}:${pad(d.getUTCSeconds())}`; };
  const num = (v) => (v === null || v === undefined || Number.isNaN(v)) ? "—" :
    (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2));

  const watch = (el) => {
    if (!seen) {
      seen = new IntersectionObserver((entries) => {
        for (const e of entries) {
          if (e.isIntersecting) onScreen.add(e.target.id); else onScreen.delete(e.target.id);
        }
        if (entries.some((e) => e.isIntersecting && stale.has(e.target.id))) draw("now");
      });
    }
    if (!el.dataset.watched) { el.dataset.watched = "1"; seen.observe(el); }
  };

  // How long the plots may wait: a pixel of the widest plot's time axis, at least MIN_GAP_MS.
  const gapMs = (els) => Math.max(MIN_GAP_MS, ...els.map((el) => (windowS * 1000) / Math.max(el.clientWidth || 1, 1)));

  // `how`: "all" — every plot (the window was (re)sent); "now" — the plots on screen (one scrolled into view);
  // "due" — the plots on screen once their wait is over, with any plot off screen last drawn OFF_SCREEN_MS ago
  // (a full-page screenshot, a glance after scrolling: never older than that). Plots drawn together share one
  // time range.
  const draw = (how) => {
    if (!window.Dygraph) return;
    const els = [...document.querySelectorAll("#telemetry-plots [data-plot]")];
    els.forEach(watch);
    const now = performance.now();
    if (how === "due") {
      const due = lastDraw + gapMs(els.filter((el) => onScreen.has(el.id)));
      if (now < due) {
        if (timer === null) timer = setTimeout(() => { timer = null; draw("due"); }, due - now);
        return;
      }
    }
    if (how !== "now") lastDraw = now;
    const end = rows.length ? Math.max(rows[rows.length - 1][0] * 1000, Date.now()) : Date.now();
    const range = [end - windowS * 1000, end];
    for (const el of els) {
      const meta = JSON.parse(el.dataset.plot);
      const shown = onScreen.has(el.id);
      if (!(how === "all" || shown || (how === "due" && now - (drawnAt[el.id] || -Infinity) >= OFF_SCREEN_MS))) {
        stale.add(el.id);
        continue;
      }
      drawnAt[el.id] = now;
      stale.delete(el.id);
      stats.draws += 1;
      const data = [];
      let any = false;
      for (const r of rows) {
        const vals = meta.cols.map((i) => (r[i] === undefined ? null : r[i]));
        if (vals.some((v) => v !== null)) any = true;
        data.push([new Date(r[0] * 1000), ...vals]);
      }
      const empty = el.querySelector(".moet-plot-empty");
      if (empty) empty.style.display = any ? "none" : "flex";
      el.dataset.points = String(any ? data.length : 0);
      let g = graphs[el.id];
      if (!any) { if (g) { g.destroy(); delete graphs[el.id]; el.querySelectorAll(":scope > div:not(.moet-plot-empty)").forEach((d) => d.remove()); } continue; }
      if (!g) {
        const box = document.createElement("div");
        box.style.cssText = "position:absolute;inset:0";
        el.appendChild(box);
        g = graphs[el.id] = new window.Dygraph(box, data, {
          labels: ["time", ...meta.labels], colors: meta.colors, ylabel: meta.unit, labelsUTC: true,
          dateWindow: range, connectSeparatedPoints: false, legend: "follow", strokeWidth: 2,
          axisLabelFontSize: 11, yLabelWidth: 14, xAxisHeight: 20, includeZero: false, labelsSeparateLines: true,
          axes: { x: { valueFormatter: (ms) => hms(ms), pixelsPerLabel: 70 },
                  y: Object.assign({ valueFormatter: (v) => num(v) + " " + meta.unit, axisLabelWidth: 42 },
                                   meta.integer ? { ticker: wholeTicks } : {}) },
          ...(meta.integer ? { includeZero: true } : {}),
        });
      } else {
        g.updateOptions({ file: data, dateWindow: range });
      }
    }
  };

  // a count's axis (requests): whole numbers from 0, at most ~5 of them (issue 49: 0, 0.2 … 1)
  const wholeTicks = (min, max) => {
    const hi = Math.max(1, Math.ceil(max)), step = Math.max(1, Math.ceil(hi / 5)), out = [];
    for (let v = 0; v <= hi; v += step) out.push({ v, label: String(v) });
    return out;
  };

  window.__moetPlots = {
    // each drawn plot's time range [ms, ms], of the plots on screen (what one sees: one range for all; a plot
    // off screen is drawn afresh when scrolled into view)
    ranges() { const out = {}; for (const id in graphs) if (onScreen.has(id)) out[id] = graphs[id].xAxisRange(); return out; },
    stats,
    apply(part) {
      windowS = part.window_s || windowS;
      if (part.reset) rows = part.rows.slice();
      else rows.push(...part.rows);
      const cut = (Date.now() / 1000) - windowS;
      let i = 0;
      while (i < rows.length && rows[i][0] < cut) i++;
      if (i) rows = rows.slice(i);
      // a long window grows by a sample a second: thin its older half when it holds far more than a plot shows
      if (rows.length > 2400) rows = rows.filter((_, k) => k % 2 === 0 || k >= rows.length - 600);
      const how = part.reset ? "all" : "due";
      load().then(() => draw(how), () => {
        for (const e of document.querySelectorAll("#telemetry-plots .moet-plot-empty")) {
          e.textContent = "plot library missing: install libjs-dygraphs (scripts/bootstrap.sh)";
        }
      });
    },
  };
})();
